// Command go-memcached is the Memcached operator written the way the operator-sdk tutorial
// writes it with controller-runtime: a typed Memcached, a reconciler that creates or scales a
// Deployment named after it, lists the pods by label from the cache, and writes status.nodes.
// It is wasmop's Go baseline in tests/bench.
//
// The kind is a flag so that several copies can run side by side, each on its own CRD:
//
//	go-memcached --kind bench.wasmop.io/v1alpha1/Memcached3 --concurrency 4
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

const image = "memcached:1.4.36-alpine"

func main() {
	var (
		kindFlag    string
		concurrency int
		qps         float64
		burst       int
		syncPeriod  time.Duration
		metricsAddr string
	)
	// --kubeconfig is registered by controller-runtime's config package.
	flag.StringVar(&kindFlag, "kind", "cache.example.com/v1alpha1/Memcached",
		"the parent kind, as group/version/Kind")
	flag.IntVar(&concurrency, "concurrency", 1, "MaxConcurrentReconciles")
	flag.Float64Var(&qps, "qps", 0, "client QPS; 0 keeps controller-runtime's default (no client-side limit)")
	flag.IntVar(&burst, "burst", 0, "client burst; 0 keeps controller-runtime's default")
	flag.DurationVar(&syncPeriod, "sync-period", 0,
		"informer resync period; 0 keeps controller-runtime's default")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", `metrics address; "0" turns it off`)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	setupLog := ctrl.Log.WithName("setup")

	gvk, err := parseKind(kindFlag)
	if err != nil {
		setupLog.Error(err, "bad --kind")
		os.Exit(2)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	addMemcached(scheme, gvk)

	cfg := ctrl.GetConfigOrDie()
	if qps > 0 {
		cfg.QPS = float32(qps)
	}
	if burst > 0 {
		cfg.Burst = burst
	}
	setupLog.Info("client rate limits", "qps", cfg.QPS, "burst", cfg.Burst)

	cacheOpts := cache.Options{}
	if syncPeriod > 0 {
		cacheOpts.SyncPeriod = &syncPeriod
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Cache:                  cacheOpts,
	})
	if err != nil {
		setupLog.Error(err, "unable to create the manager")
		os.Exit(1)
	}
	r := &MemcachedReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme()}
	if err := r.SetupWithManager(mgr, gvk, concurrency); err != nil {
		setupLog.Error(err, "unable to create the controller")
		os.Exit(1)
	}
	setupLog.Info("starting manager", "kind", gvk.String(), "concurrency", concurrency)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "manager stopped")
		os.Exit(1)
	}
}

func parseKind(s string) (schema.GroupVersionKind, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return schema.GroupVersionKind{}, fmt.Errorf("want group/version/Kind, got %q", s)
	}
	return schema.GroupVersionKind{Group: parts[0], Version: parts[1], Kind: parts[2]}, nil
}

// MemcachedReconciler reconciles a Memcached object.
type MemcachedReconciler struct {
	client.Client
	Scheme *runtime.Scheme
}

// Reconcile keeps a Deployment of spec.size memcached pods and reports the pods in
// status.nodes.
func (r *MemcachedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)

	memcached := &Memcached{}
	if err := r.Get(ctx, req.NamespacedName, memcached); err != nil {
		// Deleted: its Deployment goes with it (owner reference).
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	found := &appsv1.Deployment{}
	err := r.Get(ctx, types.NamespacedName{Name: memcached.Name, Namespace: memcached.Namespace}, found)
	if err != nil && apierrors.IsNotFound(err) {
		dep, err := r.deploymentForMemcached(memcached)
		if err != nil {
			return ctrl.Result{}, err
		}
		logger.V(1).Info("creating a Deployment", "name", dep.Name)
		if err := r.Create(ctx, dep); err != nil {
			return ctrl.Result{}, err
		}
		// The new Deployment's events (Owns) bring us back.
		return ctrl.Result{}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}

	size := memcached.Spec.Size
	if found.Spec.Replicas == nil || *found.Spec.Replicas != size {
		found.Spec.Replicas = &size
		if err := r.Update(ctx, found); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, nil
	}

	podList := &corev1.PodList{}
	if err := r.List(ctx, podList,
		client.InNamespace(memcached.Namespace),
		client.MatchingLabels(labelsForMemcached(memcached.Name))); err != nil {
		return ctrl.Result{}, err
	}
	podNames := getPodNames(podList.Items)
	if !slices.Equal(podNames, memcached.Status.Nodes) {
		memcached.Status.Nodes = podNames
		if err := r.Status().Update(ctx, memcached); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// deploymentForMemcached returns a memcached Deployment owned by m.
func (r *MemcachedReconciler) deploymentForMemcached(m *Memcached) (*appsv1.Deployment, error) {
	ls := labelsForMemcached(m.Name)
	replicas := m.Spec.Size
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: ls},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: ls},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: ls},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Image:   image,
						Name:    "memcached",
						Command: []string{"memcached", "-m=64", "-o", "modern", "-v"},
						Ports:   []corev1.ContainerPort{{ContainerPort: 11211, Name: "memcached"}},
					}},
				},
			},
		},
	}
	if err := ctrl.SetControllerReference(m, dep, r.Scheme); err != nil {
		return nil, err
	}
	return dep, nil
}

func labelsForMemcached(name string) map[string]string {
	return map[string]string{"app": "memcached", "memcached_cr": name}
}

func getPodNames(pods []corev1.Pod) []string {
	names := make([]string, 0, len(pods))
	for _, pod := range pods {
		names = append(names, pod.Name)
	}
	sort.Strings(names)
	return names
}

// SetupWithManager registers the controller: Memcached objects and the Deployments they own.
func (r *MemcachedReconciler) SetupWithManager(mgr ctrl.Manager, gvk schema.GroupVersionKind, concurrency int) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&Memcached{}).
		Owns(&appsv1.Deployment{}).
		Named(strings.ToLower(gvk.Kind)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(r)
}
