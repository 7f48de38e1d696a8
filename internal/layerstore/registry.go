package layerstore

import (
	"github.com/socialweb-computer/socialweb/internal/registry"
)

// Watch makes every image stored in rs (pushed to it, or loaded by Import) queue its
// layers on p. Set it before rs serves or imports.
func (p *Preparer) Watch(rs *registry.Server) {
	rs.LayersStored = func(ls []registry.Layer) { p.Enqueue(fromRegistry(ls)...) }
}

// CatchUp queues the layers of every image already in rs that the store lacks: images
// pushed before the store existed, by a process that did not prepare them, or whose
// preparation failed. It returns how many it queued.
func (p *Preparer) CatchUp(rs *registry.Server) (int, error) {
	ls, err := rs.AllLayers()
	return p.Enqueue(fromRegistry(ls)...), err
}

func fromRegistry(ls []registry.Layer) []Layer {
	out := make([]Layer, len(ls))
	for i, l := range ls {
		out[i] = Layer{Digest: l.Digest, DiffID: l.DiffID, MediaType: l.MediaType, Size: l.Size}
	}
	return out
}
