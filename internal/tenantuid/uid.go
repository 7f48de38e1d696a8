// Package tenantuid is the identity a tenant's control plane runs as (its own
// uid and gid, derived from its apiserver port) and the daemon's hostile-file
// safe access to the files that identity may write.
package tenantuid

import "fmt"

// DefaultBase is serve's --control-plane-uid-base: far above any uid a
// distribution hands out, and below 2^31 so that no tool reads it as negative.
const DefaultBase = 2_000_000_000

// MinBase is the smallest base other than 0: below it a tenant's uid may be an
// ordinary user's or a system account's.
const MinBase = 65536

// maxID is the largest uid or gid: (uid_t)-1 means "unchanged" to the kernel.
const maxID = 1<<32 - 2

// maxPort is the largest TCP port.
const maxPort = 65535

// Owner is the uid and gid of a tenant's control plane; the zero Owner is root
// (the daemon's uid base 0).
type Owner struct{ UID, GID int }

// Root says whether o is root: the control plane runs as the daemon does.
func (o Owner) Root() bool { return o.UID == 0 && o.GID == 0 }

// ValidateBase checks serve's --control-plane-uid-base.
func ValidateBase(base int64) error {
	switch {
	case base == 0:
		return nil
	case base < MinBase:
		return fmt.Errorf("%d: want 0 (control planes run as root) or at least %d (below it a tenant's uid may be a user's or a system account's)", base, MinBase)
	case base+maxPort > maxID:
		return fmt.Errorf("%d: want at most %d, so that the base plus any port (up to %d) is a uid", base, maxID-maxPort, maxPort)
	}
	return nil
}

// For is the owner of the control plane that serves port: uid = gid = base +
// port. The port, not the node network, since a cluster holds its port for its
// whole life and gives its network back while it sleeps. Base 0 is root.
func For(base int64, port int) (Owner, error) {
	if err := ValidateBase(base); err != nil {
		return Owner{}, fmt.Errorf("control-plane uid base %w", err)
	}
	if base == 0 {
		return Owner{}, nil
	}
	if port < 1 || port > maxPort {
		return Owner{}, fmt.Errorf("port %d: want 1-%d", port, maxPort)
	}
	id := int(base) + port
	return Owner{UID: id, GID: id}, nil
}
