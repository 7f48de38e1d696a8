package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletconfigvalidation "k8s.io/kubernetes/pkg/kubelet/apis/config/validation"
	"k8s.io/kubernetes/pkg/kubelet/eviction"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig/configfiles"
	utilfs "k8s.io/kubernetes/pkg/util/filesystem"
)

// LoadKubeletServer turns a kubelet configuration file and command-line
// flags into the kubelet's options, the way app.NewKubeletCommand does
// (flags parsed into KubeletFlags, the file loaded, defaulted and converted
// like --config, feature gates applied, both validated), without cobra and
// without the signal handler that command installs.
func LoadKubeletServer(ctx context.Context, configFile string, args []string) (*options.KubeletServer, error) {
	fs := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	kf := options.NewKubeletFlags()
	kf.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kubelet flags: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("kubelet flags: unexpected arguments %q", fs.Args())
	}
	kc, err := loadKubeletConfigFile(ctx, configFile)
	if err != nil {
		return nil, err
	}
	kf.KubeletConfigFile = configFile
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(kc.FeatureGates); err != nil {
		return nil, fmt.Errorf("kubelet feature gates: %w", err)
	}
	if err := options.ValidateKubeletFlags(kf); err != nil {
		return nil, fmt.Errorf("kubelet flags: %w", err)
	}
	if err := kubeletconfigvalidation.ValidateKubeletConfiguration(kc, utilfeature.DefaultFeatureGate); err != nil {
		return nil, fmt.Errorf("kubelet configuration %s: %w", configFile, err)
	}
	return &options.KubeletServer{KubeletFlags: *kf, KubeletConfiguration: *kc}, nil
}

// loadKubeletConfigFile is app.loadConfigFile (unexported there).
func loadKubeletConfigFile(ctx context.Context, name string) (*kubeletconfiginternal.KubeletConfiguration, error) {
	abs, err := filepath.Abs(name)
	if err != nil {
		return nil, err
	}
	loader, err := configfiles.NewFsLoader(&utilfs.DefaultFs{}, abs)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration %s: %w", name, err)
	}
	kc, err := loader.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration %s: %w", name, err)
	}
	if kc.EvictionHard == nil {
		kc.EvictionHard = eviction.DefaultEvictionHard
	} else if kc.MergeDefaultEvictionSettings {
		for k, v := range eviction.DefaultEvictionHard {
			if _, ok := kc.EvictionHard[k]; !ok {
				kc.EvictionHard[k] = v
			}
		}
	}
	return kc, nil
}

// RunKubelet runs the kubelet in this process until ctx is cancelled (it
// returns nil then) or it fails to start. It can run once per process: the
// kubelet registers metrics and global state that a second instance would
// collide with.
//
// Lifecycle notes that matter for PID 1:
//   - no signal handler is installed; the caller owns SIGTERM/SIGINT and
//     cancels ctx.
//   - app.Run blocks in TLS bootstrap until the apiserver issues a client
//     certificate, then starts the kubelet's loops and returns only when ctx
//     is done. Goroutines the kubelet started keep running after that; the
//     agent powers the machine off next, so they are not waited for.
//   - a few kubelet paths call os.Exit (klog.Fatal, and the certificate
//     manager when it has had no valid client certificate for 5 minutes
//     while the apiserver answers). In PID 1 that panics the kernel, and with
//     panic=-1 on the command line the VM resets, which the host sees as the
//     VM exiting.
func RunKubelet(ctx context.Context, s *options.KubeletServer) error {
	logs.InitLogs()
	if err := logsapi.ValidateAndApplyAsField(&s.KubeletConfiguration.Logging, utilfeature.DefaultFeatureGate, field.NewPath("logging")); err != nil {
		return fmt.Errorf("kubelet logging: %w", err)
	}
	deps, err := app.UnsecuredDependencies(ctx, s, utilfeature.DefaultFeatureGate)
	if err != nil {
		return fmt.Errorf("kubelet dependencies: %w", err)
	}
	utilfeature.DefaultMutableFeatureGate.AddMetrics()
	err = app.Run(ctx, s, deps, utilfeature.DefaultFeatureGate)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
