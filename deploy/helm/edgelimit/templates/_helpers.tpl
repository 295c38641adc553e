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

{{/*
What values.schema.json cannot say: values that must agree with each other,
and the Redis URL's form, checked without quoting it (it may hold a
password). Each fails naming the values, before anything is installed,
where Envoy or the sidecar would refuse them only in the running pod.
*/}}
{{- define "edgelimit.validate" -}}
{{- /* One network namespace for the pod: every listener on its own port. */ -}}
{{- $ports := dict -}}
{{- range $name, $port := dict "envoy.port" .Values.envoy.port "envoy.adminPort" .Values.envoy.adminPort "envoy.statsPort" .Values.envoy.statsPort "sidecar.port" .Values.sidecar.port "sidecar.adminPort" .Values.sidecar.adminPort -}}
{{- $k := toString (int $port) -}}
{{- if hasKey $ports $k -}}
{{- fail (printf "%s and %s: both are %s; Envoy and the sidecar share the pod's network, so each listener needs a port of its own" (get $ports $k) $name $k) -}}
{{- end -}}
{{- $_ := set $ports $k $name -}}
{{- end -}}
{{- /* Every route's cluster is one of envoy.clusters; a name given once, and not the chart's own. */ -}}
{{- $clusters := dict -}}
{{- range $i, $c := .Values.envoy.clusters -}}
{{- if has $c.name (list "ratelimit_sidecar" "envoy_admin") -}}
{{- fail (printf "envoy.clusters[%d].name: %q is the chart's own cluster; name the service otherwise" $i $c.name) -}}
{{- end -}}
{{- if hasKey $clusters $c.name -}}
{{- fail (printf "envoy.clusters[%d].name: %q is already envoy.clusters[%d]'s; Envoy refuses a cluster named twice" $i $c.name (get $clusters $c.name)) -}}
{{- end -}}
{{- $_ := set $clusters $c.name $i -}}
{{- end -}}
{{- range $i, $r := .Values.envoy.routes -}}
{{- if not (hasKey $clusters $r.cluster) -}}
{{- fail (printf "envoy.routes[%d].cluster: %q is none of envoy.clusters (%s); Envoy refuses a route to an unknown cluster" $i $r.cluster (keys $clusters | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- /* One source for the secrets: an existing Secret, or the values. */ -}}
{{- if and .Values.secrets.existingSecret (or .Values.secrets.keySalt .Values.secrets.redisPassword) -}}
{{- fail "secrets.keySalt or secrets.redisPassword is set beside secrets.existingSecret, which the sidecar then reads them from instead (the values would be ignored): put them in that Secret (keys key-salt, redis-password) or leave secrets.existingSecret empty" -}}
{{- end -}}
{{- /* The sidecar's -redis forms; a password goes in the Secret. */ -}}
{{- $url := required "redis.url is required" .Values.redis.url -}}
{{- if not (regexMatch "^(redis|rediss|unix|redis\\+cluster|rediss\\+cluster|redis\\+sentinel|rediss\\+sentinel)://" $url) -}}
{{- fail "redis.url: must start with redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel:// (sidecar/README.md, \"Redis URL\"); the value is not shown, as it may hold a password" -}}
{{- end -}}
{{- if regexMatch "^[a-z+]+://[^/@?#]*:[^/@?#]+@" $url -}}
{{- fail "redis.url: holds a password, which would be in the Deployment's pod spec in clear (the value is not shown): give it as secrets.redisPassword, or as redis-password in secrets.existingSecret" -}}
{{- end -}}
{{- end -}}
