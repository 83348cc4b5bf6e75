{{/* Chart name, overridable. */}}
{{- define "dlock-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or the release name alone when it already contains the chart name. */}}
{{- define "dlock-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dlock-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "dlock-operator.labels" -}}
helm.sh/chart: {{ include "dlock-operator.chart" . }}
{{ include "dlock-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dlock
{{- end }}

{{/* Labels the Deployment selects its pods by (immutable once installed). */}}
{{- define "dlock-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dlock-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dlock-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dlock-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest when a digest is given (the tag is then ignored, so
what runs cannot change under a moved tag), else repository:tag. */}}
{{- define "dlock-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) }}
{{- end }}
{{- end }}

{{- define "dlock-operator.workloadImage" -}}
{{- default (include "dlock-operator.image" .) .Values.workloadImage }}
{{- end }}

{{- define "dlock-operator.leaseName" -}}
{{- default (include "dlock-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* A label map as the operator's selector flags take it: k=v,k=v (sorted by key). */}}
{{- define "dlock-operator.labelList" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end }}
