{{/*
Names are fixed, not derived from the release name: every Pilotfish part (pilotfish/names.py)
agrees on them, and the chart's cluster-scoped objects make it a once-per-cluster install.
*/}}

{{- define "pilotfish.name" -}}
pilotfish
{{- end }}

{{- define "pilotfish.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* ServiceAccount (and Deployment) names, one per component: pilotfish/names.py SA_* */}}
{{- define "pilotfish.operator.name" -}}pilotfish-operator{{- end }}
{{- define "pilotfish.extender.name" -}}pilotfish-extender{{- end }}
{{- define "pilotfish.webhooks.name" -}}pilotfish-webhooks{{- end }}
{{- define "pilotfish.scheduler.name" -}}pilotfish-scheduler{{- end }}
{{/* The batch operator's writes are made as this account (names.SA_BATCH). */}}
{{- define "pilotfish.batch.name" -}}pilotfish-batch{{- end }}

{{/* Name of the second scheduler (pilotfish/names.py SCHEDULER_NAME), also its lease name. */}}
{{- define "pilotfish.schedulerName" -}}pilotfish-scheduler{{- end }}

{{- define "pilotfish.webhooks.tlsSecret" -}}pilotfish-webhooks-tls{{- end }}
{{- define "pilotfish.webhooks.clientCA" -}}pilotfish-webhooks-client-ca{{- end }}
{{- define "pilotfish.extender.tlsSecret" -}}pilotfish-extender-tls{{- end }}
{{- define "pilotfish.scheduler.extenderClientSecret" -}}pilotfish-scheduler-extender-client{{- end }}
{{- define "pilotfish.scheduler.configMap" -}}pilotfish-scheduler-config{{- end }}
{{- define "pilotfish.operator.metricsService" -}}pilotfish-operator-metrics{{- end }}

{{/*
Common labels. Call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "pilotfish.labels" -}}
{{ include "pilotfish.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pilotfish
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "pilotfish.chart" .ctx }}
{{- end }}

{{/*
Selector labels (immutable on Deployments). Call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "pilotfish.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pilotfish.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{/* Image of the Pilotfish components; the tag defaults to the chart's appVersion. */}}
{{- define "pilotfish.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* URL prefix of the scheduler extender, as the scheduler sees it (always HTTPS). */}}
{{- define "pilotfish.extenderURL" -}}
{{- if .Values.local.enabled -}}
{{- printf "https://%s:%d" .Values.local.host (int .Values.local.extenderPort) }}
{{- else -}}
{{- printf "https://%s.%s.svc:443" (include "pilotfish.extender.name" .) .Release.Namespace }}
{{- end }}
{{- end }}

{{/* Pod-level security context shared by every Pilotfish pod. */}}
{{- define "pilotfish.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security context shared by every Pilotfish container. */}}
{{- define "pilotfish.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Pod spec fields shared by every Pilotfish pod. Call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "pilotfish.podCommon" -}}
serviceAccountName: {{ printf "pilotfish-%s" .component }}
automountServiceAccountToken: true
priorityClassName: {{ .ctx.Values.priorityClassName | quote }}
enableServiceLinks: false
securityContext:
  {{- include "pilotfish.podSecurityContext" . | nindent 2 }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "pilotfish.selectorLabels" . | nindent 14 }}
{{- end }}

{{/* Environment shared by the Pilotfish containers. Call with the root context. */}}
{{- define "pilotfish.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: PILOTFISH_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: PYTHONUNBUFFERED
  value: "1"
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- end }}

{{/*
Webhook clientConfig. Call with (dict "ctx" $ "path" "/mutate/pods" "caBundle" $ca).
Local mode: by URL on the host, with the caBundle from values (required).
Otherwise: through the webhooks Service, with the CA generated in webhook-configurations.yaml.
*/}}
{{- define "pilotfish.webhookClientConfig" -}}
{{- $v := .ctx.Values -}}
{{- if $v.local.enabled -}}
url: {{ printf "https://%s:%d%s" $v.local.host (int $v.local.webhookPort) .path | quote }}
caBundle: {{ required "local.caBundle (base64 PEM of the CA of the local webhook server) is required when local.enabled is true" $v.local.caBundle | quote }}
{{- else -}}
service:
  name: {{ include "pilotfish.webhooks.name" .ctx }}
  namespace: {{ .ctx.Release.Namespace }}
  path: {{ .path | quote }}
  port: 443
caBundle: {{ .caBundle | quote }}
{{- end }}
{{- end }}

{{/*
Namespaces the webhooks never see: the control plane's and Pilotfish's own (no deadlock when
the webhooks are down), and any namespace labelled pilotfish.io/webhooks=disabled.
Call with the root context.
*/}}
{{- define "pilotfish.webhookNamespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      - kube-system
      - kube-public
      - kube-node-lease
      - {{ .Release.Namespace | quote }}
  - key: pilotfish.io/webhooks
    operator: NotIn
    values: [disabled]
{{- end }}
