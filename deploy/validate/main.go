// Command validate checks rendered Kubernetes manifests strictly against the API types they name.
//
//	helm template deploy/helm/embedstream | validate -          # or: validate FILE...
//	validate -json FILE...   # on success, the decoded objects as one JSON array (for tests to read)
//
// Every YAML document is decoded into its Go type from k8s.io/api, KEDA's apis (keda.sh/v1alpha1) or
// prometheus-operator's (monitoring.coreos.com/v1): an unknown kind, an unknown or misspelled field, a
// field of the wrong type, a duplicate key, all fail (strict decoding, as the API server's
// fieldValidation=Strict). Then the objects are checked together (checks.go): names and labels,
// selectors that match a rendered pod template, probe and Service ports that name a container port,
// volume mounts that name a volume, ScaledObjects whose target is rendered and whose kafka trigger
// metadata KEDA's own parser accepts (keda.go). Exit 1 with one line per problem; 0 prints a summary.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	quiet := flag.Bool("q", false, "print nothing when every object is valid")
	asJSON := flag.Bool("json", false, "on success print the decoded objects as a JSON array instead of the summary")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: validate [-q] FILE... (- for standard input)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctrllog.SetLogger(logr.Discard()) // KEDA's webhook validators log through controller-runtime

	var objects []*object
	var problems []string
	for _, name := range flag.Args() {
		data, err := read(name)
		if err != nil {
			fmt.Fprintf(os.Stderr, "validate: %v\n", err)
			os.Exit(2)
		}
		objs, errs := decodeAll(name, data)
		objects = append(objects, objs...)
		problems = append(problems, errs...)
	}
	problems = append(problems, checkAll(objects)...)
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, p)
		}
		fmt.Fprintf(os.Stderr, "validate: %d problem(s) in %d object(s)\n", len(problems), len(objects))
		os.Exit(1)
	}
	if len(objects) == 0 {
		fmt.Fprintln(os.Stderr, "validate: no objects in the input")
		os.Exit(1)
	}
	switch {
	case *asJSON:
		out := make([]any, len(objects))
		for i, o := range objects {
			out[i] = o.obj
		}
		data, err := json.Marshal(out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "validate: %v\n", err)
			os.Exit(2)
		}
		fmt.Println(string(data))
	case !*quiet:
		fmt.Println(summary(objects))
	}
}

func read(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// summary: "validated 14 objects: 1 Deployment, 4 PodDisruptionBudget, ..." (kinds sorted by name).
func summary(objects []*object) string {
	counts := map[string]int{}
	for _, o := range objects {
		counts[o.gvk.Kind]++
	}
	kinds := make([]string, 0, len(counts))
	for kind := range counts {
		kinds = append(kinds, kind)
	}
	sort.Strings(kinds)
	parts := make([]string, len(kinds))
	for i, kind := range kinds {
		parts[i] = fmt.Sprintf("%d %s", counts[kind], kind)
	}
	return fmt.Sprintf("validated %d objects: %s", len(objects), strings.Join(parts, ", "))
}
