package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// FromUnstructured converts a dynamic client's object into a Cluster.
func FromUnstructured(u *unstructured.Unstructured) (*Cluster, error) {
	var c Cluster
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &c); err != nil {
		return nil, fmt.Errorf("decoding cluster %s: %w", u.GetName(), err)
	}
	return &c, nil
}

// ToUnstructured converts a Cluster for a dynamic client.
func (c *Cluster) ToUnstructured() (*unstructured.Unstructured, error) {
	c.APIVersion = Group + "/" + Version
	c.Kind = Kind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
	if err != nil {
		return nil, fmt.Errorf("encoding cluster %s: %w", c.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}
