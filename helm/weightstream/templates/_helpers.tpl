{{- define "weightstream.name" -}}{{ .Release.Name }}-weightstream{{- end -}}

{{- define "weightstream.labels" -}}
app.kubernetes.io/name: weightstream
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "weightstream.selector" -}}
app.kubernetes.io/name: weightstream
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "weightstream.secretName" -}}
{{- if .Values.existingSecret -}}{{ .Values.existingSecret }}{{- else -}}{{ include "weightstream.name" . }}-token{{- end -}}
{{- end -}}
