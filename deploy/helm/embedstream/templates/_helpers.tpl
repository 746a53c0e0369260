{{/* Names ---------------------------------------------------------------------------------------- */}}

{{- define "embedstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name; component names append "-embed-online" etc., so it stays under 40 characters. */}}
{{- define "embedstream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "embedstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "embedstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels: (dict "root" $ "component" "embed-online") */}}
{{- define "embedstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "embedstream.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "embedstream.labels" -}}
{{ include "embedstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "embedstream.image" -}}
{{ printf "%s:%s" .Values.image.repository (toString .Values.image.tag) }}
{{- end }}

{{/* Checks of the values that the templates rely on (a clear error instead of a broken pod). */}}
{{- define "embedstream.checkValues" -}}
{{- $k := .Values.kafka }}
{{- if not $k.bootstrapServers }}{{ fail "kafka.bootstrapServers is required (a comma-separated broker list)" }}{{ end }}
{{- if not (has $k.securityProtocol (list "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL")) }}
{{- fail (printf "kafka.securityProtocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, got %q" $k.securityProtocol) }}
{{- end }}
{{- if hasPrefix "SASL_" $k.securityProtocol }}
{{- if not (has $k.sasl.mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) }}
{{- fail (printf "kafka.sasl.mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with %s, got %q" $k.securityProtocol $k.sasl.mechanism) }}
{{- end }}
{{- if not $k.sasl.secretName }}{{ fail "kafka.sasl.secretName: the Secret with the SASL username and password is required with SASL" }}{{ end }}
{{- end }}
{{- if and (hasSuffix "SSL" $k.securityProtocol) (not $k.tls.secretName) }}
{{- fail "kafka.tls.secretName: the Secret with the brokers' CA is required with SSL and SASL_SSL" }}
{{- end }}
{{- if ne (empty $k.tls.certKey) (empty $k.tls.keyKey) }}{{ fail "kafka.tls.certKey and kafka.tls.keyKey go together (mutual TLS)" }}{{ end }}
{{- if not .Values.qdrant.url }}{{ fail "qdrant.url is required: every worker writes the same Qdrant" }}{{ end }}
{{- if and .Values.rerank.enabled (hasPrefix "/models/" .Values.rerank.model) (not .Values.modelsVolume) }}
{{- fail "rerank.model is a folder under /models: set modelsVolume (no cross-encoder ships with the image)" }}
{{- end }}
{{- end }}

{{/* KEDA's name for a SASL mechanism. */}}
{{- define "embedstream.kedaSasl" -}}
{{- get (dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512") .Values.kafka.sasl.mechanism }}
{{- end }}

{{- define "embedstream.kafkaSecured" -}}
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" }}true{{ end }}
{{- end }}

{{/* Kafka names ---------------------------------------------------------------------------------- */}}

{{/* The prefix of every topic and group of this release: "<namespace>.<release>." (kafka.namePrefix null: two
releases in one cluster never share a name), "<namePrefix>." or "" (namePrefix ""). */}}
{{- define "embedstream.kafkaPrefix" -}}
{{- $p := .Values.kafka.namePrefix }}
{{- if kindIs "invalid" $p }}{{ printf "%s.%s." .Release.Namespace .Release.Name }}{{ else if $p }}{{ printf "%s." $p }}{{ end }}
{{- end }}

{{/* This release's Kafka names, as YAML (include ... | fromYaml): topics and groups (kafka.topics / kafka.groups
with the prefix; the claims topic without: it is where deployments of one cluster meet), gatewayReplies, deployment (its claim on its collection: workers/claim.py) and its collection's
own topics and search group (producers/search_routing.py: <search>.<collection>, <queries>.<collection>,
<groups.search>.<collection>). One place: the workers' environment and the KEDA triggers both read it. */}}
{{- define "embedstream.kafkaNames" -}}
{{- $p := include "embedstream.kafkaPrefix" . }}
{{- $collection := regexReplaceAll "_v[1-9][0-9]*$" (.Values.qdrant.collection | default "docs") "" }}
topics:
{{- range $key, $topic := .Values.kafka.topics }}
  {{ $key }}: {{ printf "%s%s" (ternary "" $p (eq $key "claims")) $topic | quote }}
{{- end }}
groups:
{{- range $key, $group := .Values.kafka.groups }}
  {{ $key }}: {{ printf "%s%s" $p $group | quote }}
{{- end }}
gatewayReplies: {{ printf "%s%s" $p .Values.gateway.replyTopic | quote }}
deployment: {{ trimSuffix "." $p | default (include "embedstream.fullname" .) | quote }}
collectionSearch: {{ printf "%s%s.%s" $p .Values.kafka.topics.search $collection | quote }}
collectionQueries: {{ printf "%s%s.%s" $p .Values.kafka.topics.queries $collection | quote }}
collectionGroup: {{ printf "%s%s.%s" $p .Values.kafka.groups.search $collection | quote }}
{{- end }}

{{/* Environment ---------------------------------------------------------------------------------- */}}

{{/* Kafka and Qdrant settings shared by every workload: (dict "root" $ "topics" <topic names that differ>). */}}
{{- define "embedstream.connectionEnv" -}}
{{- $names := include "embedstream.kafkaNames" .root | fromYaml }}
{{- $topics := merge (dict) (.topics | default dict) $names.topics }}
{{- $root := .root }}
{{- with .root }}
{{- $k := .Values.kafka }}
- name: EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS
  value: {{ $k.bootstrapServers | quote }}
- name: EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if hasPrefix "SASL_" $k.securityProtocol }}
- name: EMBEDSTREAM_KAFKA__SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: EMBEDSTREAM_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ $k.sasl.secretName | quote }}, key: {{ $k.sasl.usernameKey | quote }}}
- name: EMBEDSTREAM_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $k.sasl.secretName | quote }}, key: {{ $k.sasl.passwordKey | quote }}}
{{- end }}
{{- if $k.tls.secretName }}
- name: EMBEDSTREAM_KAFKA__SSL_CAFILE
  value: /etc/embedstream/kafka-tls/ca.crt
{{- if $k.tls.certKey }}
- name: EMBEDSTREAM_KAFKA__SSL_CERTFILE
  value: /etc/embedstream/kafka-tls/tls.crt
- name: EMBEDSTREAM_KAFKA__SSL_KEYFILE
  value: /etc/embedstream/kafka-tls/tls.key
{{- end }}
{{- end }}
{{- range $key, $topic := $topics }}
- name: EMBEDSTREAM_KAFKA__TOPIC_{{ upper $key }}
  value: {{ $topic | quote }}
{{- end }}
{{- range $key, $group := $names.groups }}
- name: EMBEDSTREAM_KAFKA__GROUP_{{ upper $key }}
  value: {{ $group | quote }}
{{- end }}
- name: EMBEDSTREAM_KAFKA__DEPLOYMENT
  value: {{ $names.deployment | quote }}
{{- with $k.sessionTimeoutMs }}
- name: EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS
  value: {{ . | toString | quote }}
{{- end }}
- name: EMBEDSTREAM_QDRANT__URL
  value: {{ .Values.qdrant.url | quote }}
{{- if .Values.qdrant.apiKey.secretName }}
- name: EMBEDSTREAM_QDRANT__API_KEY
  valueFrom:
    secretKeyRef: {name: {{ .Values.qdrant.apiKey.secretName | quote }}, key: {{ .Values.qdrant.apiKey.key | quote }}}
{{- end }}
{{- with .Values.qdrant.collection }}
- name: EMBEDSTREAM_QDRANT__COLLECTION
  value: {{ . | quote }}
{{- end }}
{{- range $key, $name := dict "shardNumber" "SHARD_NUMBER" "replicationFactor" "REPLICATION_FACTOR" "writeConsistencyFactor" "WRITE_CONSISTENCY_FACTOR" }}
{{- with index $root.Values.qdrant $key }}
- name: EMBEDSTREAM_QDRANT__{{ $name }}
  value: {{ . | toString | quote }}
{{- end }}
{{- end }}
{{- with .Values.model }}
- name: EMBEDSTREAM_DEFAULT_MODEL
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Environment of one workload: (dict "root" $ "w" <its values> "static" bool ["topics" <dict>]). No name twice. */}}
{{- define "embedstream.env" -}}
{{- $root := .root }}
{{- include "embedstream.connectionEnv" (dict "root" $root "topics" .topics) }}
- name: EMBEDSTREAM_WORKER__HEALTH_HOST
  value: 0.0.0.0
{{- if and .static $root.Values.kafka.staticMembership }}
- name: EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
{{- end }}
{{- with .w.threads }}
- name: EMBEDSTREAM_ENGINE__THREADS
  value: {{ . | toString | quote }}
{{- end }}
{{- with .w.precision }}
- name: EMBEDSTREAM_ENGINE__PRECISION
  value: {{ . | quote }}
{{- end }}
{{- $own := merge (dict) (.w.env | default dict) $root.Values.env }}
{{- range $name, $value := $own }}
{{- if or (hasPrefix "EMBEDSTREAM_KAFKA__TOPIC_" $name) (hasPrefix "EMBEDSTREAM_KAFKA__GROUP_" $name) (has $name (list "EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS" "EMBEDSTREAM_KAFKA__DEPLOYMENT" "EMBEDSTREAM_QDRANT__URL" "EMBEDSTREAM_QDRANT__API_KEY" "EMBEDSTREAM_KAFKA__SASL_PASSWORD")) }}
{{- fail (printf "env %s: set it through the chart's kafka/qdrant values (the KEDA triggers and Secrets use them too)" $name) }}
{{- end }}
{{- if or (and $.w.threads (eq $name "EMBEDSTREAM_ENGINE__THREADS")) (and $.w.precision (eq $name "EMBEDSTREAM_ENGINE__PRECISION")) (eq $name "EMBEDSTREAM_WORKER__HEALTH_HOST" "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID" "EMBEDSTREAM_DEFAULT_MODEL" "EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL") }}
{{- fail (printf "env %s: the chart sets it (threads, precision, model, kafka values)" $name) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* Pod parts ------------------------------------------------------------------------------------ */}}

{{- define "embedstream.volumes" -}}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.secretName | quote }}
    defaultMode: 0440
    items:
      - {key: {{ .Values.kafka.tls.caKey | quote }}, path: ca.crt}
      {{- if .Values.kafka.tls.certKey }}
      - {key: {{ .Values.kafka.tls.certKey | quote }}, path: tls.crt}
      - {key: {{ .Values.kafka.tls.keyKey | quote }}, path: tls.key}
      {{- end }}
{{- end }}
{{- with .Values.modelsVolume }}
- name: models
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "embedstream.volumeMounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: home, mountPath: /home/embedstream}
{{- if .Values.kafka.tls.secretName }}
- {name: kafka-tls, mountPath: /etc/embedstream/kafka-tls, readOnly: true}
{{- end }}
{{- if .Values.modelsVolume }}
- {name: models, mountPath: /models, readOnly: true}
{{- end }}
{{- end }}

{{/* Pod spec fields shared by every workload: (dict "root" $ "component" name ["hook" true]). A pre-install
hook runs before the release's ServiceAccount exists: it keeps the namespace's default one (no token either). */}}
{{- define "embedstream.podCommon" -}}
{{- $root := .root }}
{{- if not .hook }}
serviceAccountName: {{ include "embedstream.serviceAccountName" $root }}
{{- end }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $root.Values.spreadAcrossNodes }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "embedstream.selectorLabels" . | trim | nindent 8 }}
{{- end }}
volumes:
  {{- include "embedstream.volumes" $root | trim | nindent 2 }}
{{- end }}

{{/* Probes on a named port: (dict "root" $ "port" "metrics" "live" "/healthz" "ready" "/readyz"). */}}
{{- define "embedstream.probes" -}}
{{- $p := .root.Values.probes }}
startupProbe:
  httpGet: {path: {{ .live }}, port: {{ .port }}}
  {{- toYaml $p.startup | nindent 2 }}
livenessProbe:
  httpGet: {path: {{ .live }}, port: {{ .port }}}
  {{- toYaml $p.liveness | nindent 2 }}
readinessProbe:
  httpGet: {path: {{ .ready }}, port: {{ .port }}}
  {{- toYaml $p.readiness | nindent 2 }}
{{- end }}

{{- define "embedstream.podAnnotations" -}}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | toString | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{- define "embedstream.pdb" -}}
{{- $labels := dict "root" .root "component" .component }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  labels:
    {{- include "embedstream.labels" $labels | trim | nindent 4 }}
spec:
  {{- toYaml .pdb | nindent 2 }}
  selector:
    matchLabels:
      {{- include "embedstream.selectorLabels" $labels | trim | nindent 6 }}
{{- end }}
