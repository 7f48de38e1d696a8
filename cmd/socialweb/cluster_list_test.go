package main

import (
	"bytes"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func TestWriteClusterTable(t *testing.T) {
	fresh := v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "new", CreationTimestamp: ago(5 * time.Second)}}
	placed := readyCluster()
	placed.Status.Host = "h1"
	tests := []struct {
		name string
		cs   []v1.Cluster
		wide bool
		want string
	}{
		{"none", nil, false, "NAME   PHASE   URL   NODES   AGE   HOST\n"},
		{"the default columns", []v1.Cluster{*placed, fresh}, false,
			"NAME   PHASE   URL                      NODES   AGE   HOST\n" +
				"ci     Ready   https://127.0.0.1:7500   2       2h    h1\n" +
				"new                                     0       5s    <none>\n"},
		{"wide", []v1.Cluster{*placed, fresh}, true,
			"NAME   PHASE    URL                      NODES   AGE   HOST     GATEWAY      NODE CIDR       NODE CPUS   NODE MEMORY   NODE DISK   MAX NODES   SLEEP AFTER   DATASTORE   LAST DECISION\n" +
				"ci     Ready    https://127.0.0.1:7500   2       2h    h1       10.250.1.1   10.250.1.0/24   1-4         1Gi-8Gi       10Gi-40Gi   5           10m           sqlite      Provision to 2, 3m ago\n" +
				"new    <none>   <none>                   0       5s    <none>   <none>       <none>          default     default       default     default     default       default     <none>\n"},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		if err := writeClusterTable(&b, tt.cs, tt.wide, summaryNow); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tt.name, b.String(), tt.want)
		}
	}
}

// -o json|yaml of `cluster list` is a List of the objects as the API returned
// them, without managedFields.
func TestClusterListObject(t *testing.T) {
	item := unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "socialweb.computer/v1alpha1", "kind": "Cluster",
		"metadata": map[string]any{"name": "ci", "managedFields": []any{map[string]any{"manager": "socialweb"}}},
		"spec":     map[string]any{"maxNodes": int64(5), "somethingNewer": "kept"},
	}}
	bare := unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "bare"}}}
	list := &unstructured.UnstructuredList{Items: []unstructured.Unstructured{item, bare}}
	var b bytes.Buffer
	if err := writeObject(&b, outputYAML, clusterListObject(list)); err != nil {
		t.Fatal(err)
	}
	want := `apiVersion: v1
items:
- apiVersion: socialweb.computer/v1alpha1
  kind: Cluster
  metadata:
    name: ci
  spec:
    maxNodes: 5
    somethingNewer: kept
- apiVersion: socialweb.computer/v1alpha1
  kind: Cluster
  metadata:
    name: bare
kind: List
`
	if b.String() != want {
		t.Errorf("cluster list -o yaml:\n%s\nwant:\n%s", b.String(), want)
	}
	if _, ok := list.Items[0].Object["metadata"].(map[string]any)["managedFields"]; !ok {
		t.Error("clusterListObject changed the list it was given")
	}
	b.Reset()
	if err := writeObject(&b, outputJSON, clusterListObject(&unstructured.UnstructuredList{})); err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"apiVersion\": \"v1\",\n  \"items\": [],\n  \"kind\": \"List\"\n}\n"; b.String() != want {
		t.Errorf("no clusters -o json: %s, want %s", b.String(), want)
	}
}
