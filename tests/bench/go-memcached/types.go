package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MemcachedSpec is the desired state of a Memcached.
type MemcachedSpec struct {
	// Size is the number of memcached pods.
	Size int32 `json:"size"`
}

// MemcachedStatus is the observed state of a Memcached.
type MemcachedStatus struct {
	// Nodes are the names of the memcached pods, sorted.
	Nodes []string `json:"nodes,omitempty"`
}

// Memcached is the custom resource. The same Go type serves whichever kind --kind names.
type Memcached struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MemcachedSpec   `json:"spec,omitempty"`
	Status MemcachedStatus `json:"status,omitempty"`
}

// MemcachedList is a list of Memcached.
type MemcachedList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Memcached `json:"items"`
}

// addMemcached registers the types under the kind chosen at run time (and <Kind>List).
func addMemcached(scheme *runtime.Scheme, gvk schema.GroupVersionKind) {
	gv := gvk.GroupVersion()
	scheme.AddKnownTypeWithName(gvk, &Memcached{})
	scheme.AddKnownTypeWithName(gv.WithKind(gvk.Kind+"List"), &MemcachedList{})
	metav1.AddToGroupVersion(scheme, gv)
}

// The deep copies controller-gen would generate, written out by hand.

// DeepCopyInto copies the receiver into out.
func (in *Memcached) DeepCopyInto(out *Memcached) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec
	if in.Status.Nodes != nil {
		out.Status.Nodes = make([]string, len(in.Status.Nodes))
		copy(out.Status.Nodes, in.Status.Nodes)
	}
}

// DeepCopy returns a copy of the receiver.
func (in *Memcached) DeepCopy() *Memcached {
	if in == nil {
		return nil
	}
	out := new(Memcached)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *Memcached) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies the receiver into out.
func (in *MemcachedList) DeepCopyInto(out *MemcachedList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Memcached, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of the receiver.
func (in *MemcachedList) DeepCopy() *MemcachedList {
	if in == nil {
		return nil
	}
	out := new(MemcachedList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *MemcachedList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}
