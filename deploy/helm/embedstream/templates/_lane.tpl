{{/*
A lane: one consumer group's workers as a StatefulSet (stable pod names = static member ids), its
governing headless Service, a PodDisruptionBudget and a KEDA ScaledObject on the group's lag.

  (dict "root" $ "component" "embed-online" "w" .Values.embedOnline "args" (list ...)
        "group" <consumer group> "topics" (dict <key> <topic> ...)
        ["groups" (dict <key> <another group>)] ["offered" true])

Each topic is one kafka trigger with the lane's autoscaling.lagThreshold.<key>, on the lane's group (or
groups.<key>: the collection's search group reads the collection's search topic); "offered": a prometheus
trigger on the queries offered per worker (answered + shed), when keda.prometheus.serverAddress is set.
KEDA scales to the largest count any of them asks for.
*/}}
{{- define "embedstream.lane" -}}
{{- $root := .root }}
{{- $w := .w }}
{{- $name := printf "%s-%s" (include "embedstream.fullname" $root) .component }}
{{- $labels := dict "root" $root "component" .component }}
{{- $port := $root.Values.metrics.port }}
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "embedstream.labels" $labels | trim | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "embedstream.selectorLabels" $labels | trim | nindent 4 }}
  ports:
    - {name: metrics, port: {{ $port }}, targetPort: metrics}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  labels:
    {{- include "embedstream.labels" $labels | trim | nindent 4 }}
spec:
  serviceName: {{ $name }}
  {{- if not $root.Values.keda.enabled }}
  replicas: {{ $w.replicas }}
  {{- end }}
  # Workers need no ordered start; a scale-out starts every new pod at once.
  podManagementPolicy: Parallel
  updateStrategy:
    type: RollingUpdate
  selector:
    matchLabels:
      {{- include "embedstream.selectorLabels" $labels | trim | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "embedstream.labels" $labels | trim | nindent 8 }}
      {{- with include "embedstream.podAnnotations" (dict "Values" $root.Values "port" $port) }}
      annotations:
        {{- . | trim | nindent 8 }}
      {{- end }}
    spec:
      {{- include "embedstream.podCommon" $labels | trim | nindent 6 }}
      containers:
        - name: worker
          image: {{ include "embedstream.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- range (concat .args (list "--metrics-port" (toString $port)) ($w.extraArgs | default list)) }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- include "embedstream.env" (dict "root" $root "w" $w "static" true) | trim | nindent 12 }}
          ports:
            - {name: metrics, containerPort: {{ $port }}, protocol: TCP}
          {{- include "embedstream.probes" (dict "root" $root "port" "metrics" "live" "/healthz" "ready" "/readyz") | trim | nindent 10 }}
          resources:
            {{- toYaml $w.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "embedstream.volumeMounts" $root | trim | nindent 12 }}
---
{{ include "embedstream.pdb" (dict "root" $root "component" .component "name" $name "pdb" $w.pdb) }}
{{- if $root.Values.keda.enabled }}
{{- $a := $w.autoscaling }}
{{- $k := $root.Values.kafka }}
{{- $k8s := $root.Values.keda }}
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  labels:
    {{- include "embedstream.labels" $labels | trim | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: StatefulSet
    name: {{ $name }}
  pollingInterval: {{ $k8s.pollingInterval }}
  cooldownPeriod: {{ $k8s.cooldownPeriod }}
  minReplicaCount: {{ $a.minReplicas }}
  maxReplicaCount: {{ $a.maxReplicas }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          stabilizationWindowSeconds: {{ $k8s.scaleDown.stabilizationWindowSeconds }}
          policies:
            - {type: Pods, value: {{ $k8s.scaleDown.pods }}, periodSeconds: {{ $k8s.scaleDown.periodSeconds }}}
  triggers:
    {{- range $key, $topic := .topics }}
    {{- $threshold := index $a.lagThreshold $key | default "" }}
    {{- if not $threshold }}{{ fail (printf "%s: autoscaling.lagThreshold.%s is required (records of lag per worker)" $name $key) }}{{ end }}
    - type: kafka
      name: {{ $key | replace "_" "-" }}
      metadata:
        bootstrapServers: {{ $k.bootstrapServers | quote }}
        consumerGroup: {{ get ($.groups | default dict) $key | default $.group | quote }}
        topic: {{ $topic | quote }}
        lagThreshold: {{ $threshold | int64 | toString | quote }}
        activationLagThreshold: {{ $a.activationLagThreshold | default 0 | int64 | toString | quote }}
        # The workers start a new group at the earliest offset: so does the lag KEDA computes.
        offsetResetPolicy: earliest
        {{- if hasPrefix "SASL_" $k.securityProtocol }}
        sasl: {{ include "embedstream.kedaSasl" $root | quote }}
        {{- end }}
        {{- if hasSuffix "SSL" $k.securityProtocol }}
        tls: enable
        {{- end }}
      {{- if include "embedstream.kafkaSecured" $root }}
      authenticationRef:
        name: {{ include "embedstream.fullname" $root }}-kafka
      {{- end }}
    {{- end }}
    {{- $prom := $k8s.prometheus }}
    {{- if and .offered $prom.serverAddress }}
    {{- if not $a.offeredQueriesPerS }}{{ fail (printf "%s: autoscaling.offeredQueriesPerS is required with keda.prometheus.serverAddress (queries/s per worker)" $name) }}{{ end }}
    {{- $sel := $prom.selector | default (printf "namespace=%q,pod=~%q" $root.Release.Namespace (printf "%s-[0-9]+" $name)) }}
    {{- $window := $prom.window }}
    # Queries offered (answered + shed: a shed query is committed and never shows as lag) per worker.
    - type: prometheus
      name: offered-queries
      metricType: AverageValue
      metadata:
        serverAddress: {{ $prom.serverAddress | quote }}
        query: {{ printf "(sum(rate(embedstream_texts_total{lane=\"online\",kind=\"query\",%s}[%s])) or vector(0)) + (sum(rate(embedstream_shed_total{lane=\"online\",%s}[%s])) or vector(0))" $sel $window $sel $window | quote }}
        threshold: {{ $a.offeredQueriesPerS | toString | quote }}
        activationThreshold: {{ $prom.activationThreshold | default 0 | toString | quote }}
    {{- end }}
{{- end }}
{{- end }}
