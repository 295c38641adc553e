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

{{/*
A bash command POSTing to Envoy's admin on loopback through bash's /dev/tcp
(the image has no curl) and reading the answer: (list ADMIN-PORT PATH).
*/}}
{{- define "edgelimit.adminPost" -}}
{{- printf "exec 3<>/dev/tcp/127.0.0.1/%d && printf 'POST %s HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n' >&3 && cat <&3 >/dev/null" (index . 0) (index . 1) -}}
{{- end -}}
