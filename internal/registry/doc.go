// Package registry is the host-side OCI registry every node's containerd pulls from, and
// a pull-through cache of every other registry: a node asks for docker.io/library/golang
// or ghcr.io/org/app here; what the store lacks the host fetches from that registry (or
// the operator's mirror of it, Upstream), stores and serves as it arrives, so a large
// image crosses the uplink once, not once per microVM. Images pushed on the host
// (`socialweb image push`) are served as they are and never replaced from upstream.
//
// Each cluster's nodes get a view (NodeHandlerFor, view.go): the shared images (pushed
// host-wide, pulled anonymously) and the cluster's own overlay (pushed for it alone,
// pulled with its Pods' credentials). A blob is served only under a name whose view
// references it, or that upstream says holds it for the node's credentials.
//
// It speaks the part of the OCI distribution API containerd uses to pull (GET /v2/,
// HEAD/GET manifests by tag or digest, HEAD/GET blobs with Range), the push API (POST,
// PATCH and PUT uploads, monolithic POST ?digest=, cross-repository mount, PUT manifests),
// tags/list, _catalog (both with n/last pagination) and DELETE of tags and manifests.
// Errors are OCI error documents with the spec's codes. Manifest media types: OCI image
// manifest and index, Docker schema2 manifest and manifest list. There is no
// authentication. Nodes, which run tenant code, are served NodeHandler: GET and HEAD
// only, no _catalog (DENIED otherwise), so no Pod can change what another tenant
// pulls. Handler, with pushes, is for the host's own use; `socialweb image push`
// writes the shared directory directly.
//
// # Names: one registry, a mirror of every registry
//
// A node's containerd has certs.d/_default/hosts.toml pointing every registry at this
// server (capabilities pull and resolve). containerd then keeps the repository path of
// the reference and names the original registry in a ns query parameter:
//
//	docker.io/library/busybox:stable  ->  GET /v2/library/busybox/manifests/stable?ns=docker.io
//	registry.k8s.io/pause:3.10        ->  GET /v2/pause/manifests/3.10?ns=registry.k8s.io
//
// Repositories are stored under a canonical name, the fully qualified name of the
// reference:
//
//   - with ?ns=R: R/path (index.docker.io and registry-1.docker.io are docker.io; a
//     one-component docker.io path gets library/). The two requests above are
//     docker.io/library/busybox and registry.k8s.io/pause.
//   - without ns (a client talking to this registry by its own address, e.g. a push to
//     localhost:5000/foo:1): when the first path component is a registry host (has a dot
//     or a port, or is localhost), the rest is that registry's repository, so a push to
//     localhost:5000/docker.io/library/busybox:stable fills the docker.io mirror;
//     otherwise the name is a local repository and is kept as is ("foo").
//   - a ns that names this registry itself (localhost, 127.0.0.1, ::1, Server.SelfHosts;
//     any port) is treated as no ns.
//
// Import and List use the same canonical names; Import accepts references the way
// containerd writes them ("busybox" is docker.io/library/busybox:latest,
// "localhost:5000/foo:1" is the local "foo"). _catalog lists canonical names.
//
// Blobs are global, not per repository: any name serves any blob it is asked for by
// digest. Manifests are per repository (a manifest pushed to one name is not served by
// another unless tagged or linked there; an index links the manifests it lists).
//
// # Storage
//
//	<Dir>/blobs/sha256/<hex>                                        every blob, manifests included
//	<Dir>/repositories/<name>/_manifests/tags/<tag>                 "sha256:<hex>\n"
//	<Dir>/repositories/<name>/_manifests/revisions/sha256/<hex>     the manifest's media type
//	<Dir>/uploads/                                                  upload sessions, temp files, import staging
//
// <name> is the canonical name, slashes as directories (a name component cannot start
// with "_", so _manifests never collides with one). Every write goes to a temp file in
// uploads/, is synced, and is renamed into place; blob and manifest content is hashed
// and checked against its digest first. Readers therefore see complete files only, and
// several processes (the daemon serving, a CLI importing) may share one Dir. Upload
// sessions live in the serving process's memory; files in uploads/ older than a day are
// removed when a Server starts. Nothing is garbage-collected: deleting a tag leaves its
// blobs.
//
//	<Dir>/repositories/_tenants/<cluster>/<name>/...                a cluster's overlay
//	<Dir>/upstream/<repo>/_tags/<tag>                               a tag pulled through: the digest, mtime = last confirmed
//	<Dir>/charges/<cluster>/<hex>                                   the cluster that brought blob <hex> in (charges.go)
//
// # Several hosts
//
// Hosts sharing one management API keep a store each. Pull-through stays per host:
// each fetches from upstream what its own nodes use, so hosts need no shared file
// system and none depends on another for the world's images. Pushed images are the
// operator's and exist where they were pushed, so a node's request for a reference its
// view lacks asks the other hosts (Server.Peers) before upstream; a peer holding it
// as a pushed image of the same scope (shared, or pushed for that node's cluster)
// serves it over PeerHandler (read-only, pushed content only; the daemon serves it on
// --registry-peer-address over mutual TLS), and it is copied here as pushed content of
// that scope: served from the store from then on, never replaced from upstream
// (peers.go).
//
// # Why not a library, and which one for upstream
//
// For the upstream side (ping, Basic and Bearer token auth, token refresh, error
// documents) go-containerregistry's remote/transport is used: that protocol is theirs
// to keep right. distribution's proxy mode was weighed and not taken: it proxies one
// upstream per registry process with one credential of the operator's, so neither
// "any registry from one endpoint" nor "pulled with this tenant's credentials, seen
// by this tenant only" fits it, and it has no hook for the layer unpacking. What stays
// here is names (?ns=), per-cluster views, the store and the fetch-once streaming.
//
// Weighed before growing this package: go-containerregistry's pkg/registry (v0.22.1)
// keeps manifests and tags in a map in memory (only blobs have a disk handler), so a
// daemon restart would lose every pushed image, and it has no hook for what a push
// must start here (unpacking layers for the nodes, internal/layerstore).
// distribution/distribution is a whole registry whose filesystem driver could replace
// store.go, but it brings its configuration, storage-driver and notification machinery
// and a large dependency tree, and the mirror naming above (containerd's ?ns=) and the
// push hook would still be written here. What is ours is the part no library has: the
// names, the on-disk layout several processes share, and Import of docker-archive and
// OCI tarballs.
package registry
