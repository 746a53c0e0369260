package main

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// workload is a rendered object with a pod template.
type workload struct {
	*object
	template *corev1.PodTemplateSpec
}

// checks collects problems, each prefixed with the object it is about.
type checks struct {
	problems  []string
	workloads []workload
	byKind    map[string]map[string]*object // kind -> name -> object
}

func (c *checks) add(o *object, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s: %s", o, fmt.Sprintf(format, args...)))
}

func (c *checks) fieldErrors(o *object, errs field.ErrorList) {
	for _, err := range errs {
		c.add(o, "%v", err)
	}
}

// checkAll runs the per-object and cross-object checks; the order of the problems is the input's.
func checkAll(objects []*object) []string {
	c := &checks{byKind: map[string]map[string]*object{}}
	for _, o := range objects {
		key := o.meta.GetNamespace() + "/" + o.meta.GetName()
		if c.byKind[o.gvk.Kind] == nil {
			c.byKind[o.gvk.Kind] = map[string]*object{}
		}
		if _, dup := c.byKind[o.gvk.Kind][key]; dup {
			c.add(o, "a second %s named %q", o.gvk.Kind, o.meta.GetName())
		}
		c.byKind[o.gvk.Kind][key] = o
		if t := podTemplate(o.obj); t != nil {
			c.workloads = append(c.workloads, workload{o, t})
		}
	}
	for _, o := range objects {
		c.metadata(o)
		switch obj := o.obj.(type) {
		case *appsv1.Deployment:
			c.selector(o, obj.Spec.Selector, &obj.Spec.Template)
		case *appsv1.StatefulSet:
			c.selector(o, obj.Spec.Selector, &obj.Spec.Template)
			if svc := c.find("Service", o, obj.Spec.ServiceName); svc == nil {
				c.add(o, "serviceName %q: no such Service rendered", obj.Spec.ServiceName)
			} else if svc.obj.(*corev1.Service).Spec.ClusterIP != corev1.ClusterIPNone {
				c.add(o, "serviceName %q: the governing Service of a StatefulSet must be headless (clusterIP: None)", obj.Spec.ServiceName)
			}
		case *appsv1.DaemonSet:
			c.selector(o, obj.Spec.Selector, &obj.Spec.Template)
		case *corev1.Service:
			c.service(o, obj)
		case *policyv1.PodDisruptionBudget:
			c.pdb(o, obj)
		case *autoscalingv2.HorizontalPodAutoscaler:
			c.target(o, obj.Spec.ScaleTargetRef.APIVersion, obj.Spec.ScaleTargetRef.Kind, obj.Spec.ScaleTargetRef.Name)
			if obj.Spec.MinReplicas != nil && *obj.Spec.MinReplicas > obj.Spec.MaxReplicas {
				c.add(o, "minReplicas %d > maxReplicas %d", *obj.Spec.MinReplicas, obj.Spec.MaxReplicas)
			}
		case *kedav1alpha1.ScaledObject:
			c.scaledObject(o, obj)
		case *kedav1alpha1.TriggerAuthentication:
			if _, err := obj.ValidateCreate(nil); err != nil {
				c.add(o, "%v", err)
			}
		case *monitoringv1.PodMonitor:
			c.podMonitor(o, obj)
		}
	}
	for _, w := range c.workloads {
		c.podSpec(w.object, &w.template.Spec)
	}
	c.releases(objects)
	return c.problems
}

func podTemplate(obj any) *corev1.PodTemplateSpec {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template
	case *appsv1.StatefulSet:
		return &o.Spec.Template
	case *appsv1.DaemonSet:
		return &o.Spec.Template
	case *appsv1.ReplicaSet:
		return &o.Spec.Template
	case *batchv1.Job:
		return &o.Spec.Template
	case *batchv1.CronJob:
		return &o.Spec.JobTemplate.Spec.Template
	}
	return nil
}

func (c *checks) find(kind string, near *object, name string) *object {
	return c.byKind[kind][near.meta.GetNamespace()+"/"+name]
}

func (c *checks) metadata(o *object) {
	name := o.meta.GetName()
	path := field.NewPath("metadata")
	if name == "" {
		c.add(o, "metadata.name is required")
	} else {
		valid := validation.IsDNS1123Subdomain
		if o.gvk.Kind == "Service" {
			valid = validation.IsDNS1035Label
		}
		for _, msg := range valid(name) {
			c.add(o, "metadata.name %q: %s", name, msg)
		}
	}
	if ns := o.meta.GetNamespace(); ns != "" {
		for _, msg := range validation.IsDNS1123Label(ns) {
			c.add(o, "metadata.namespace %q: %s", ns, msg)
		}
	}
	c.fieldErrors(o, metavalidation.ValidateLabels(o.meta.GetLabels(), path.Child("labels")))
	c.fieldErrors(o, apivalidation.ValidateAnnotations(o.meta.GetAnnotations(), path.Child("annotations")))
}

// selector: a workload's selector is given, valid, and selects its own pod template.
func (c *checks) selector(o *object, sel *metav1.LabelSelector, t *corev1.PodTemplateSpec) {
	if sel == nil {
		c.add(o, "spec.selector is required")
		return
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		c.add(o, "spec.selector: %v", err)
		return
	}
	if s.Empty() {
		c.add(o, "spec.selector is empty: it would select every pod")
	}
	if !s.Matches(labels.Set(t.Labels)) {
		c.add(o, "spec.selector %s does not match the pod template's labels %v", s, t.Labels)
	}
	c.fieldErrors(o, metavalidation.ValidateLabels(t.Labels, field.NewPath("spec", "template", "metadata", "labels")))
	c.fieldErrors(o, apivalidation.ValidateAnnotations(t.Annotations, field.NewPath("spec", "template", "metadata", "annotations")))
}

// selected: the rendered workloads whose pod templates a selector matches.
func (c *checks) selected(o *object, sel labels.Selector) []workload {
	var out []workload
	for _, w := range c.workloads {
		if w.meta.GetNamespace() == o.meta.GetNamespace() && sel.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

func (c *checks) labelSelector(o *object, what string, sel *metav1.LabelSelector) []workload {
	if sel == nil {
		c.add(o, "%s is required", what)
		return nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		c.add(o, "%s: %v", what, err)
		return nil
	}
	if s.Empty() {
		c.add(o, "%s is empty: it would select every pod", what)
	}
	matched := c.selected(o, s)
	if len(matched) == 0 {
		c.add(o, "%s %s matches no rendered pod template", what, s)
	}
	return matched
}

func (c *checks) service(o *object, svc *corev1.Service) {
	if len(svc.Spec.Selector) == 0 {
		c.add(o, "spec.selector is empty (a Service without a selector needs hand-made endpoints)")
		return
	}
	matched := c.labelSelector(o, "spec.selector", metav1.SetAsLabelSelector(svc.Spec.Selector))
	names := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		if names[p.Name] {
			c.add(o, "port name %q twice", p.Name)
		}
		names[p.Name] = true
		if len(svc.Spec.Ports) > 1 && p.Name == "" {
			c.add(o, "port %d needs a name (the Service has several)", p.Port)
		}
		target := p.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(p.Port)
		}
		for _, w := range matched {
			if !podHasPort(&w.template.Spec, target) {
				c.add(o, "port %q: targetPort %s is not a container port of %s", p.Name, target.String(), w.meta.GetName())
			}
		}
	}
}

func (c *checks) pdb(o *object, pdb *policyv1.PodDisruptionBudget) {
	if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
		c.add(o, "exactly one of minAvailable and maxUnavailable")
	}
	c.labelSelector(o, "spec.selector", pdb.Spec.Selector)
}

func (c *checks) podMonitor(o *object, pm *monitoringv1.PodMonitor) {
	matched := c.labelSelector(o, "spec.selector", &pm.Spec.Selector)
	for i, ep := range pm.Spec.PodMetricsEndpoints {
		if ep.Port == nil || *ep.Port == "" {
			c.add(o, "podMetricsEndpoints[%d]: port (a container port name) is required", i)
			continue
		}
		found := false
		for _, w := range matched {
			found = found || podHasPort(&w.template.Spec, intstr.FromString(*ep.Port))
		}
		if !found {
			c.add(o, "podMetricsEndpoints[%d]: no selected pod has a container port named %q", i, *ep.Port)
		}
	}
}

// target: a scale target (HPA, ScaledObject) is a rendered workload of that kind.
func (c *checks) target(o *object, apiVersion, kind, name string) *workload {
	for _, w := range c.workloads {
		if w.gvk.Kind == kind && w.gvk.GroupVersion().String() == apiVersion && w.meta.GetName() == name &&
			w.meta.GetNamespace() == o.meta.GetNamespace() {
			return &w
		}
	}
	c.add(o, "scale target %s %s (%s) is not rendered", kind, name, apiVersion)
	return nil
}

func (c *checks) scaledObject(o *object, so *kedav1alpha1.ScaledObject) {
	ref := so.Spec.ScaleTargetRef
	if ref == nil {
		c.add(o, "spec.scaleTargetRef is required")
		return
	}
	apiVersion, kind := ref.APIVersion, ref.Kind
	if apiVersion == "" {
		apiVersion = "apps/v1"
	}
	if kind == "" {
		kind = "Deployment"
	}
	target := c.target(o, apiVersion, kind, ref.Name)
	for _, check := range []func(*kedav1alpha1.ScaledObject) error{
		kedav1alpha1.CheckReplicaCountBoundsAreValid, kedav1alpha1.CheckFallbackValid,
		func(so *kedav1alpha1.ScaledObject) error { return kedav1alpha1.ValidateTriggers(so.Spec.Triggers) },
		func(so *kedav1alpha1.ScaledObject) error {
			if !so.IsUsingModifiers() {
				return nil
			}
			_, err := kedav1alpha1.ValidateAndCompileScalingModifiers(so)
			return err
		},
	} {
		if err := check(so); err != nil {
			c.add(o, "%v", err)
		}
	}
	env := map[string]string{}
	if target != nil {
		for _, ctr := range target.template.Spec.Containers {
			for _, e := range ctr.Env {
				env[e.Name] = "set-in-the-pod"
			}
		}
	}
	for i, t := range so.Spec.Triggers {
		where := fmt.Sprintf("triggers[%d] (%s %q)", i, t.Type, t.Name)
		var authParams []string
		if t.AuthenticationRef != nil {
			authParams = c.authParams(o, where, t.AuthenticationRef)
		}
		for _, msg := range checkTrigger(t, authParams, env) {
			c.add(o, "%s: %s", where, msg)
		}
	}
}

// authParams: the parameters a trigger's TriggerAuthentication provides (their values live in Secrets).
func (c *checks) authParams(o *object, where string, ref *kedav1alpha1.AuthenticationRef) []string {
	if ref.Kind != "" && ref.Kind != "TriggerAuthentication" {
		c.add(o, "%s: authenticationRef kind %q is not rendered by this chart", where, ref.Kind)
		return nil
	}
	ta := c.find("TriggerAuthentication", o, ref.Name)
	if ta == nil {
		c.add(o, "%s: authenticationRef %q: no such TriggerAuthentication rendered", where, ref.Name)
		return nil
	}
	spec := ta.obj.(*kedav1alpha1.TriggerAuthentication).Spec
	var params []string
	for _, s := range spec.SecretTargetRef {
		params = append(params, s.Parameter)
	}
	for _, e := range spec.Env {
		params = append(params, e.Parameter)
	}
	return params
}

// podSpec: containers, ports, probes, mounts, env and resources are consistent.
func (c *checks) podSpec(o *object, spec *corev1.PodSpec) {
	if len(spec.Containers) == 0 {
		c.add(o, "the pod template has no containers")
	}
	volumes := map[string]bool{}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if volumes[v.Name] {
			c.add(o, "volume %q twice", v.Name)
		}
		volumes[v.Name] = true
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			c.add(o, "volume name %q: %s", v.Name, msg)
		}
		if n := setFields(v.VolumeSource); n != 1 {
			c.add(o, "volume %q must have exactly one source, has %d", v.Name, n)
		}
	}
	if sa := spec.ServiceAccountName; sa != "" && sa != "default" {
		if account := c.find("ServiceAccount", o, sa); account == nil {
			c.add(o, "serviceAccountName %q: no such ServiceAccount rendered", sa)
		} else if preInstall(o) && !preInstall(account) {
			c.add(o, "serviceAccountName %q: a pre-install hook runs before the release's ServiceAccount exists", sa)
		}
	}
	names := map[string]bool{}
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for i := range all {
		ctr := &all[i]
		if names[ctr.Name] {
			c.add(o, "container %q twice", ctr.Name)
		}
		names[ctr.Name] = true
		c.container(o, ctr, volumes)
	}
}

func (c *checks) container(o *object, ctr *corev1.Container, volumes map[string]bool) {
	in := func(format string, args ...any) { c.add(o, "container %q: %s", ctr.Name, fmt.Sprintf(format, args...)) }
	if ctr.Image == "" {
		in("image is required")
	}
	ports := map[string]bool{}
	for _, p := range ctr.Ports {
		if p.ContainerPort < 1 || p.ContainerPort > 65535 {
			in("containerPort %d out of range", p.ContainerPort)
		}
		if p.Name != "" {
			for _, msg := range validation.IsValidPortName(p.Name) {
				in("port name %q: %s", p.Name, msg)
			}
			if ports[p.Name] {
				in("port name %q twice", p.Name)
			}
			ports[p.Name] = true
		}
	}
	for name, probe := range map[string]*corev1.Probe{"livenessProbe": ctr.LivenessProbe,
		"readinessProbe": ctr.ReadinessProbe, "startupProbe": ctr.StartupProbe} {
		if probe == nil {
			continue
		}
		if n := setFields(probe.ProbeHandler); n != 1 {
			in("%s must have exactly one handler, has %d", name, n)
		}
		var port *intstr.IntOrString
		if probe.HTTPGet != nil {
			port = &probe.HTTPGet.Port
			if !strings.HasPrefix(probe.HTTPGet.Path, "/") {
				in("%s: path %q must start with /", name, probe.HTTPGet.Path)
			}
		} else if probe.TCPSocket != nil {
			port = &probe.TCPSocket.Port
		}
		if port != nil && port.Type == intstr.String && !ports[port.StrVal] {
			in("%s: port %q is not a port of this container", name, port.StrVal)
		}
		if name == "startupProbe" || name == "livenessProbe" {
			if probe.SuccessThreshold > 1 {
				in("%s: successThreshold must be 1", name)
			}
		}
	}
	for _, m := range ctr.VolumeMounts {
		if !volumes[m.Name] {
			in("volumeMount %q: no such volume", m.Name)
		}
		if !strings.HasPrefix(m.MountPath, "/") {
			in("volumeMount %q: mountPath %q must be absolute", m.Name, m.MountPath)
		}
	}
	env := map[string]bool{}
	for _, e := range ctr.Env {
		if env[e.Name] {
			in("env %s twice (the last one wins silently)", e.Name)
		}
		env[e.Name] = true
		if e.ValueFrom != nil {
			if e.Value != "" {
				in("env %s: value and valueFrom are exclusive", e.Name)
			}
			if n := setFields(*e.ValueFrom); n != 1 {
				in("env %s: valueFrom must have exactly one source, has %d", e.Name, n)
			}
		}
	}
	var over []string
	for res, limit := range ctr.Resources.Limits {
		if req, ok := ctr.Resources.Requests[res]; ok && req.Cmp(limit) > 0 {
			over = append(over, fmt.Sprintf("%s request %s > limit %s", res, req.String(), limit.String()))
		}
	}
	sort.Strings(over)
	for _, msg := range over {
		in("%s", msg)
	}
}

// preInstall: a Helm pre-install hook, created before the release's other objects.
func preInstall(o *object) bool {
	for _, hook := range strings.Split(o.meta.GetAnnotations()["helm.sh/hook"], ",") {
		if strings.TrimSpace(hook) == "pre-install" {
			return true
		}
	}
	return false
}

func podHasPort(spec *corev1.PodSpec, port intstr.IntOrString) bool {
	for _, ctr := range spec.Containers {
		for _, p := range ctr.Ports {
			if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
				return true
			}
		}
	}
	return false
}

// setFields counts the non-nil pointer fields of a union struct (VolumeSource, ProbeHandler, EnvVarSource).
func setFields(union any) int {
	v := reflect.ValueOf(union)
	n := 0
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			n++
		}
	}
	return n
}

// kafkaName is a Kafka topic or group, or a Qdrant collection, one release uses, on one cluster.
type kafkaName struct {
	what, cluster, name string
}

var kafkaTopicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// releases: two releases rendered side by side share no Kafka topic or group on one Kafka cluster (a shared
// group splits its partitions between them, a shared topic mixes their records) and no Qdrant collection on one
// server (the second deployment is refused at start: workers/claim.py); the claims topic, where they meet, is
// the one name they share. A release is an object's
// app.kubernetes.io/instance label; its names are what its pods' environment and its KEDA triggers say.
func (c *checks) releases(objects []*object) {
	users := map[kafkaName]map[string]*object{} // name -> release -> first object using it
	own := map[string][]string{}                // release -> the project's topics its pods are given
	use := func(o *object, n kafkaName) {
		release := o.meta.GetLabels()["app.kubernetes.io/instance"]
		if release == "" || n.name == "" {
			return
		}
		if users[n] == nil {
			users[n] = map[string]*object{}
		}
		if _, seen := users[n][release]; !seen {
			users[n][release] = o
		}
	}
	for _, w := range c.workloads {
		for _, ctr := range w.template.Spec.Containers {
			env := map[string]string{}
			for _, e := range ctr.Env {
				if e.ValueFrom == nil {
					env[e.Name] = e.Value
				}
			}
			cluster := env["EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS"]
			for name, value := range env {
				switch {
				case name == "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID" || name == "EMBEDSTREAM_KAFKA__GROUP_PROTOCOL":
				case name == "EMBEDSTREAM_KAFKA__TOPIC_CLAIMS": // shared on purpose: where deployments meet (workers/claim.py)
				case strings.HasPrefix(name, "EMBEDSTREAM_KAFKA__TOPIC_"):
					if !kafkaTopicName.MatchString(value) {
						c.add(w.object, "env %s: %q is not a Kafka topic name (1-249 of [a-zA-Z0-9._-])", name, value)
					}
					use(w.object, kafkaName{"topic", cluster, value})
					release := w.meta.GetLabels()["app.kubernetes.io/instance"]
					own[release] = append(own[release], value)
				case strings.HasPrefix(name, "EMBEDSTREAM_KAFKA__GROUP_"):
					use(w.object, kafkaName{"consumer group", cluster, value})
				}
			}
			if url, ok := env["EMBEDSTREAM_QDRANT__URL"]; ok {
				collection := env["EMBEDSTREAM_QDRANT__COLLECTION"]
				if collection == "" {
					collection = "docs" // the settings' default (embedstream/config.py)
				}
				use(w.object, kafkaName{"Qdrant collection", url, collection})
			}
		}
	}
	for _, o := range objects {
		so, ok := o.obj.(*kedav1alpha1.ScaledObject)
		if !ok {
			continue
		}
		for _, t := range so.Spec.Triggers {
			if t.Type != "kafka" {
				continue
			}
			// a topic of the project (one its pods are given, or a collection's under one: <search>.<collection>)
			// is the release's own; a source it only reads (a Debezium topic) may be read by others' groups
			topic := t.Metadata["topic"]
			for _, mine := range own[o.meta.GetLabels()["app.kubernetes.io/instance"]] {
				if topic == mine || strings.HasPrefix(topic, mine+".") {
					use(o, kafkaName{"topic", t.Metadata["bootstrapServers"], topic})
					break
				}
			}
			use(o, kafkaName{"consumer group", t.Metadata["bootstrapServers"], t.Metadata["consumerGroup"]})
		}
	}
	names := make([]kafkaName, 0, len(users))
	for n, by := range users {
		if len(by) > 1 {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		return a.what+"\x00"+a.cluster+"\x00"+a.name < b.what+"\x00"+b.cluster+"\x00"+b.name
	})
	for _, n := range names {
		releases := make([]string, 0, len(users[n]))
		for r := range users[n] {
			releases = append(releases, r)
		}
		sort.Strings(releases)
		why := "one release's topics and groups must be its own (kafka.namePrefix)"
		if n.what == "Qdrant collection" {
			why = "two deployments of one collection: the second is refused at start (collection_claimed)"
		}
		c.add(users[n][releases[len(releases)-1]], "releases %s share %s %q on %s: %s",
			strings.Join(releases, " and "), n.what, n.name, n.cluster, why)
	}
}
