package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one decoded document.
type object struct {
	where string // "FILE: document N"
	gvk   schema.GroupVersionKind
	obj   runtime.Object
	meta  metav1.Object
}

func (o *object) String() string {
	return fmt.Sprintf("%s (%s %s)", o.where, o.gvk.Kind, o.meta.GetName())
}

// scheme knows every built-in Kubernetes type, KEDA's and prometheus-operator's; nothing else decodes.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kedav1alpha1.AddToScheme(s))
	utilruntime.Must(monitoringv1.AddToScheme(s))
	return s
}()

// decodeAll splits a YAML stream into documents and decodes each strictly; empty documents (only
// comments or whitespace, as helm renders for a disabled template) are skipped.
func decodeAll(name string, data []byte) ([]*object, []string) {
	reader := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objects []*object
	var problems []string
	for n := 1; ; n++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		where := fmt.Sprintf("%s: document %d", name, n)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			break
		}
		obj, err := decodeStrict(doc)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		if obj != nil {
			obj.where = where
			objects = append(objects, obj)
		}
	}
	return objects, problems
}

// decodeStrict decodes one document into its registered Go type; nil, nil for an empty document.
func decodeStrict(doc []byte) (*object, error) {
	js, err := yaml.YAMLToJSONStrict(doc) // duplicate keys are an error
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %v", err)
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	if js[0] != '{' {
		return nil, fmt.Errorf("a document must be a mapping (an object), got %s", firstLine(js))
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, fmt.Errorf("apiVersion/kind: %v", err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, fmt.Errorf("apiVersion and kind are required")
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("apiVersion %q: %v", tm.APIVersion, err)
	}
	gvk := gv.WithKind(tm.Kind)
	obj, err := scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("%s %s: no such type in k8s.io/api, keda.sh/v1alpha1 or monitoring.coreos.com/v1", tm.APIVersion, tm.Kind)
	}
	strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", gvk.Kind, err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("%s: %s", gvk.Kind, strings.Join(msgs, "; "))
	}
	accessor, err := meta.Accessor(obj)
	if err != nil {
		return nil, fmt.Errorf("%s has no object metadata", gvk.Kind)
	}
	return &object{gvk: gvk, obj: obj, meta: accessor}, nil
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(string(b), "\n")
	if len(line) > 60 {
		line = line[:60] + "..."
	}
	return line
}
