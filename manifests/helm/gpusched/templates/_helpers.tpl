{{/* Labels every object carries (the same as manifests/base, so the renders compare equal). */}}
{{- define "gpusched.partOf" -}}
app.kubernetes.io/part-of: gpusched
{{- end }}

{{/* The node agents' address of the telemetry Service. */}}
{{- define "gpusched.telemetryHost" -}}
gpusched-telemetry.{{ .Values.namespace }}.svc
{{- end }}

{{/* True when the namespace differs from the one the programs default to. */}}
{{- define "gpusched.customNamespace" -}}
{{- if ne .Values.namespace "gpusched-system" }}true{{ end }}
{{- end }}
