{{- define "edgelimit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "edgelimit.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "edgelimit.labels" -}}
{{ include "edgelimit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edgelimit.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "edgelimit.fullname" .)) -}}
{{- end -}}

{{/* Where the bootstrap loads the module; the wasm volume is mounted on its directory. */}}
{{- define "edgelimit.wasmDir" -}}/etc/edgelimit/wasm{{- end -}}
