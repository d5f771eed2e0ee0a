// Command kubectl-inplace is the kubectl plugin of capi-inplace: on the PATH, `kubectl
// inplace preview` shows what an in-place upgrade of a Cluster would do before anything
// changes, and `kubectl inplace status` follows one that runs. It reads and writes only
// capi-inplace's objects (UpgradePreview, UpgradeTask, NodeUpdate) and the Cluster, with
// the kubeconfig, context and namespace kubectl would use.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/inplacectl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes: a failed preview or upgrade is 1, a command line that cannot be run is 2.
const (
	exitFailed = 1
	exitUsage  = 2
)

// usageError is a command line that cannot be run as given.
type usageError struct{ error }

// run is the command, apart from the process: tests call it with their own arguments and
// writers.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	// An error may quote the cluster (an API server's message, an object's status).
	_, _ = fmt.Fprintf(stderr, "error: %s\n", inplacectl.Clean(err.Error()))
	var usage usageError
	// cobra's own "unknown command" is a command line that cannot be run too.
	if errors.As(err, &usage) || strings.HasPrefix(err.Error(), "unknown command") {
		return exitUsage
	}
	return exitFailed
}

// connection is what kubectl's global flags choose: the kubeconfig, its context, and the
// namespace.
type connection struct {
	kubeconfig, context, namespace string
}

func (c *connection) bind(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&c.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	f.StringVar(&c.context, "context", "", "the kubeconfig context to use (default: its current context)")
	f.StringVarP(&c.namespace, "namespace", "n", "", "the namespace of the Cluster (default: the context's namespace, else default)")
}

// client builds a client of capi-inplace's and Cluster API's kinds, and the namespace, the
// way kubectl resolves them: client-go's loading rules honour $KUBECONFIG and merge its
// files; flags override the kubeconfig.
func (c *connection) client() (client.Client, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: c.context}
	overrides.Context.Namespace = c.namespace
	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	namespace, _, err := config.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("load the kubeconfig (give --kubeconfig, or set KUBECONFIG, to a readable kubeconfig): %w", err)
	}
	rest, err := config.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("load the kubeconfig (give --kubeconfig, or set KUBECONFIG, to a readable kubeconfig): %w", err)
	}
	scheme := runtime.NewScheme()
	if err := inplacev1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	if err := clusterv1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	cl, err := client.New(rest, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connect to the API server of the kubeconfig: %w", err)
	}
	return cl, namespace, nil
}

func newRootCommand(stdout io.Writer) *cobra.Command {
	conn := &connection{}
	root := &cobra.Command{
		Use:   "kubectl-inplace",
		Short: "Preview and follow in-place upgrades of Cluster API clusters (capi-inplace)",
		Long: "kubectl inplace previews what an in-place upgrade of a Cluster would do (preview) and\n" +
			"follows one that runs (status). Installed as kubectl-inplace on the PATH, kubectl runs it\n" +
			"as `kubectl inplace`.",
		SilenceUsage:  true,
		SilenceErrors: true,
		// kubectl runs the plugin as `kubectl inplace`: help says so.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl inplace"},
	}
	conn.bind(root)
	// kubectl completes plugins through kubectl_complete-<name>, not a completion subcommand.
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newPreviewCommand(conn, stdout), newStatusCommand(conn, stdout))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	return root
}

// isTerminal says whether w is a terminal a screen can be redrawn on.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
