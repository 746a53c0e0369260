package main

import (
	"fmt"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
)

//go:generate go run ./internal/genscalers

// kedaParam is one parameter of a scaler's metadata, as its `keda:"..."` tag declares it.
type kedaParam struct {
	names []string
	order map[string]bool // triggerMetadata, resolvedEnv, authParams
}

// paramsOf reads the keda tags of a typed scaler config (the tag grammar of scalersconfig: name=a;b,order=x;y,...).
func paramsOf(config any) map[string]kedaParam {
	out := map[string]kedaParam{}
	t := reflect.TypeOf(config)
	for i := range t.NumField() {
		tag, ok := t.Field(i).Tag.Lookup("keda")
		if !ok {
			continue
		}
		p := kedaParam{order: map[string]bool{}}
		for _, part := range strings.Split(tag, scalersconfig.TagSeparator) {
			key, value, _ := strings.Cut(part, scalersconfig.TagKeySeparator)
			switch strings.TrimSpace(key) {
			case scalersconfig.NameTag:
				p.names = strings.Split(value, scalersconfig.TagValueSeparator)
			case scalersconfig.OrderTag:
				for _, o := range strings.Split(value, scalersconfig.TagValueSeparator) {
					p.order[o] = true
				}
			}
		}
		for _, name := range p.names {
			out[name] = p
		}
	}
	return out
}

var (
	kafkaParams      = paramsOf(kafkaTriggerMetadata{})
	prometheusParams = paramsOf(prometheusTriggerMetadata{})
)

// checkTrigger: a trigger's metadata is what its scaler reads. Only the kafka and prometheus scalers (what
// this chart renders) and the resource scalers are known here; any other type is reported, not passed unread.
func checkTrigger(t kedav1alpha1.ScaleTriggers, authParams []string, env map[string]string) []string {
	switch t.Type {
	case "kafka":
		return checkScaler(t, kafkaParams, &kafkaTriggerMetadata{}, authParams, env)
	case "prometheus":
		problems := checkScaler(t, prometheusParams, &prometheusTriggerMetadata{}, authParams, env)
		if t.MetricType == "Utilization" {
			problems = append(problems, "metricType Utilization is for the cpu and memory scalers: AverageValue or Value")
		}
		return problems
	case "cpu", "memory":
		var problems []string
		for key, value := range t.Metadata {
			switch key {
			case "value":
				if n, err := strconv.Atoi(value); err != nil || n <= 0 {
					problems = append(problems, fmt.Sprintf("metadata.value %q must be a positive whole number", value))
				}
			case "containerName":
			default:
				problems = append(problems, fmt.Sprintf("metadata.%s: unknown to the %s scaler (known: value, containerName)", key, t.Type))
			}
		}
		if _, ok := t.Metadata["value"]; !ok {
			problems = append(problems, "metadata.value is required")
		}
		if t.MetricType == "" {
			problems = append(problems, "metricType (Utilization or AverageValue) is required")
		}
		return problems
	}
	return []string{fmt.Sprintf("trigger type %q: its metadata is not known to this validator", t.Type)}
}

// checkScaler: every metadata key is a parameter the scaler reads from the trigger's metadata (params, from
// its typed config); the TriggerAuthentication gives only authParams; then KEDA's own parser (defaults,
// required parameters, numbers, booleans, enums) and the scaler's checks (the Validate methods below)
// accept the whole, parsed into parsed (a pointer to the generated struct).
func checkScaler(t kedav1alpha1.ScaleTriggers, params map[string]kedaParam, parsed any, authParams []string,
	env map[string]string) []string {
	var problems []string
	keys := make([]string, 0, len(t.Metadata))
	for key := range t.Metadata {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		base, fromEnv := strings.CutSuffix(key, "FromEnv")
		p, known := params[base]
		switch {
		case !known:
			problems = append(problems, fmt.Sprintf("metadata.%s: not a parameter of KEDA's %s scaler", key, t.Type))
		case fromEnv && !p.order["resolvedEnv"]:
			problems = append(problems, fmt.Sprintf("metadata.%s: %s cannot be read from the environment", key, base))
		case fromEnv && env[t.Metadata[key]] == "":
			problems = append(problems, fmt.Sprintf("metadata.%s: the target's containers have no env %s", key, t.Metadata[key]))
		case !fromEnv && !p.order["triggerMetadata"]:
			problems = append(problems, fmt.Sprintf("metadata.%s: belongs in a TriggerAuthentication (authParams), not in metadata", key))
		}
	}
	auth := map[string]string{}
	for _, param := range authParams {
		if p, ok := params[param]; !ok || !p.order["authParams"] {
			problems = append(problems, fmt.Sprintf("authentication parameter %q is not one the %s scaler reads", param, t.Type))
		}
		auth[param] = "from-a-secret"
	}
	config := scalersconfig.ScalerConfig{TriggerType: t.Type, TriggerName: t.Name, TriggerMetadata: t.Metadata,
		AuthParams: auth, ResolvedEnv: env}
	if err := config.TypedConfig(parsed); err != nil {
		problems = append(problems, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return problems
}

// Validate (prometheus): what the HPA and the scaler need of the parsed metadata, without a server.
func (m *prometheusTriggerMetadata) Validate() error {
	address, err := url.Parse(m.ServerAddress)
	switch {
	case err != nil || (address.Scheme != "http" && address.Scheme != "https") || address.Host == "":
		return fmt.Errorf("serverAddress %q must be an http(s) URL with a host", m.ServerAddress)
	case strings.TrimSpace(m.Query) == "":
		return fmt.Errorf("query must be a PromQL expression")
	case m.Threshold <= 0:
		return fmt.Errorf("threshold must be a positive number, got %g", m.Threshold)
	case m.ActivationThreshold < 0:
		return fmt.Errorf("activationThreshold must be a non-negative number, got %g", m.ActivationThreshold)
	}
	return nil
}

// Validate is called by TypedConfig after parsing: the checks of KEDA's kafkaMetadata.Validate that
// need no broker (pkg/scalers/kafka_scaler.go), plus the credentials a SASL mechanism needs.
func (m *kafkaTriggerMetadata) Validate() error {
	switch {
	case m.LagThreshold <= 0:
		return fmt.Errorf("lagThreshold must be a positive number, got %d", m.LagThreshold)
	case m.ActivationLagThreshold < 0:
		return fmt.Errorf("activationLagThreshold must be a non-negative number, got %d", m.ActivationLagThreshold)
	case m.AllowIdleConsumers && m.LimitToPartitionsWithLag:
		return fmt.Errorf("allowIdleConsumers and limitToPartitionsWithLag cannot be set simultaneously")
	case m.Topic == "" && (m.LimitToPartitionsWithLag || m.EnsureEvenDistributionOfPartitions || !m.FullMetadata):
		return fmt.Errorf("topic must be specified with limitToPartitionsWithLag, ensureEvenDistributionOfPartitions or fullMetadata=false")
	case m.LimitToPartitionsWithLag && m.EnsureEvenDistributionOfPartitions:
		return fmt.Errorf("limitToPartitionsWithLag and ensureEvenDistributionOfPartitions cannot be set simultaneously")
	}
	switch m.Sasl {
	case "plaintext", "scram_sha256", "scram_sha512":
		if m.Username == "" || m.Password == "" {
			return fmt.Errorf("sasl %s needs username and password from a TriggerAuthentication", m.Sasl)
		}
	}
	if m.TLS == "enable" && (m.Cert == "") != (m.Key == "") {
		return fmt.Errorf("tls: cert and key go together")
	}
	return nil
}
