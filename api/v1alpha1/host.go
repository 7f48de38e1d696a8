package v1alpha1

import (
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

const (
	HostKind     = "Host"
	HostResource = "hosts"
)

// HostGVR is the GroupVersionResource of Host objects, for dynamic clients.
var HostGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: HostResource}

// Host is one machine of the service: a daemon that runs tenants' control
// planes and their nodes. Each daemon writes its own; its liveness is its
// Lease (HostLeaseName), not this object.
type Host struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              HostSpec   `json:"spec,omitempty"`
	Status            HostStatus `json:"status,omitempty"`
}

// HostSpec is what an operator may change of a host.
type HostSpec struct {
	// Draining: no tenant is placed here, and the host's tenants move away.
	Draining bool `json:"draining,omitempty"`
}

// HostStatus is what the host last reported of itself.
type HostStatus struct {
	// Address is where other hosts reach this one.
	Address string `json:"address,omitempty"`
	// FrontDoor is its front door's host:port, empty without one.
	FrontDoor string `json:"frontDoor,omitempty"`
	Version   string `json:"version,omitempty"`
	CPUs      int32  `json:"cpus,omitempty"`
	// Memory is the host's memory, FreeMemory what it had available when it last reported.
	Memory     resource.Quantity `json:"memory,omitempty"`
	FreeMemory resource.Quantity `json:"freeMemory,omitempty"`
	// MaxTenants is its --max-tenants (0: no cap); Tenants how many it owns, Awake
	// how many of those run a control plane now.
	MaxTenants int32       `json:"maxTenants,omitempty"`
	Tenants    int32       `json:"tenants"`
	Awake      int32       `json:"awake"`
	Reported   metav1.Time `json:"reported,omitempty"`
	// Registry is host:port of its registry's peer listener (pushed images, for
	// the other hosts, over mutual TLS), empty without one.
	Registry string `json:"registry,omitempty"`
}

// HostLeaseName is the Lease (in SystemNamespace) a live host renews.
func HostLeaseName(host string) string { return "host-" + host }

// TenantLeaseName is the Lease (in SystemNamespace) the host that runs a
// cluster holds.
func TenantLeaseName(cluster string) string { return "tenant-" + cluster }

// HostFromUnstructured converts a dynamic client's object into a Host.
func HostFromUnstructured(u *unstructured.Unstructured) (*Host, error) {
	var h Host
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &h); err != nil {
		return nil, fmt.Errorf("decoding host %s: %w", u.GetName(), err)
	}
	return &h, nil
}

// ToUnstructured converts a Host for a dynamic client.
func (h *Host) ToUnstructured() (*unstructured.Unstructured, error) {
	h.APIVersion = Group + "/" + Version
	h.Kind = HostKind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(h)
	if err != nil {
		return nil, fmt.Errorf("encoding host %s: %w", h.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// HostCRD is the Host type's definition in the management API.
func HostCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: HostResource + "." + Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: HostResource, Singular: "host", Kind: HostKind, ListKind: HostKind + "List"},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: Version, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Address", Type: "string", JSONPath: ".status.address"},
					{Name: "Tenants", Type: "integer", JSONPath: ".status.tenants"},
					{Name: "Free-Memory", Type: "string", JSONPath: ".status.freeMemory"},
					{Name: "Draining", Type: "boolean", JSONPath: ".spec.draining"},
					{Name: "Version", Type: "string", JSONPath: ".status.version"},
				},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"apiVersion": {Type: "string"},
						"kind":       {Type: "string"},
						"metadata":   {Type: "object"},
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"draining": {Type: "boolean", Description: "no tenant is placed here, and the host's tenants move away"},
						}},
						"status": {Type: "object", XPreserveUnknownFields: ptr.To(true)},
					},
				}},
			}},
		},
	}
}
