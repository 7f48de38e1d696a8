package qemu

// A warm-pool VM runs at a lower CPU priority (PoolNice) than nodes until it is claimed:
// its boot, and its idle TCG vCPU, get the host's cores only when nodes leave them free.
// Without it, five claims at once met five refills booting beside them on two cores
// (docs/benchmarks.md).
// A claim puts the VM back at the default (0) before its guest reads its identity.

// PoolNice is the nice value of an unclaimed warm-pool VM's qemu threads: a weight of
// about a tenth of a node's (CFS weights 110 against 1024), so a refill still boots on a
// busy host, only slower.
const PoolNice = 10
