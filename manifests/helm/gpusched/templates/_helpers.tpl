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

{{/* "true" in plugin mode, "" in extender mode; any other `mode` fails rendering, naming the
     allowed values (every template that differs by mode asks this, so none renders a guess). */}}
{{- define "gpusched.pluginMode" -}}
{{- $mode := kindIs "string" .Values.mode | ternary .Values.mode "" }}
{{- if eq $mode "plugin" }}true
{{- else if ne $mode "extender" }}
{{- fail (printf "mode: %v is not a mode of gpusched; set mode to extender (the default: the stock kube-scheduler calls the extender over HTTP) or plugin (the GpuSched kube-scheduler asks the core over its Unix socket)" (toJson .Values.mode)) }}
{{- end }}
{{- end }}

{{/* The profile's schedulerName: scheduler.schedulerName, or the mode's default. */}}
{{- define "gpusched.schedulerName" -}}
{{- if .Values.scheduler.schedulerName }}{{ .Values.scheduler.schedulerName }}
{{- else if include "gpusched.pluginMode" . }}gpusched-plugin
{{- else }}gpusched{{ end }}
{{- end }}

{{/* A pod spec's imagePullSecrets (the global imagePullSecrets value), or nothing. */}}
{{- define "gpusched.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* A pod's placement knobs from one component's values (`placement`): nodeSelector,
     tolerations, affinity, priorityClassName, each only when set; `root` is the chart's context. */}}
{{- define "gpusched.placement" -}}
{{- $p := .placement }}
{{- with $p.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $p.tolerations }}
tolerations:
{{- toYaml . | nindent 0 }}
{{- end }}
{{- with $p.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $p.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- include "gpusched.imagePullSecrets" .root }}
{{- end }}
