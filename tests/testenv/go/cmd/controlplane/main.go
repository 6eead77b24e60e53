// Command controlplane is one multi-call binary holding the control-plane components that the
// testenv crate starts as separate processes, and kubectl: the first argument picks the
// component, or the name the binary is called by (a symlink named kubectl).
//
//	controlplane etcd --data-dir DIR --client-url URL --peer-url URL
//	controlplane kube-apiserver|kube-controller-manager|kube-scheduler [component flags]
//	controlplane kubectl [kubectl arguments]
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		runKubectl()
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: controlplane etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl [flags]")
		os.Exit(2)
	}
	component, rest := os.Args[1], os.Args[2:]
	// cobra reads os.Args[1:], so drop the component name before handing over.
	os.Args = append([]string{component}, rest...)
	switch component {
	case "etcd":
		os.Exit(runEtcd(rest))
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		runKubectl()
	default:
		fmt.Fprintf(os.Stderr, "controlplane: unknown component %q\n", component)
		os.Exit(2)
	}
}

func runKubectl() {
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
}

func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory")
	clientURL := fs.String("client-url", "", "client URL, e.g. http://127.0.0.1:PORT")
	peerURL := fs.String("peer-url", "", "peer URL, e.g. http://127.0.0.1:PORT")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	client, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --client-url: %v\n", err)
		return 2
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --peer-url: %v\n", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "testenv"
	// A throwaway store for tests: durability is not worth the fsync latency.
	cfg.UnsafeNoFsync = true
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready")
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-stop:
		return 0
	}
	select {
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-stop:
		return 0
	}
}
