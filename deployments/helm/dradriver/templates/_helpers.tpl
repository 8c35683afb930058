{{/*
Names. Every object is named after the release ("dradriver" when the release is called
dradriver, else "<release>-dradriver"), so the default install keeps the names the
plain manifests use: dradriver-kubeletplugin, dradriver-controller, dradriver-webhook.
*/}}
{{- define "dradriver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "dradriver" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-dradriver" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dradriver.plugin" -}}{{ include "dradriver.fullname" . }}-kubeletplugin{{- end -}}
{{- define "dradriver.controller" -}}{{ include "dradriver.fullname" . }}-controller{{- end -}}
{{- define "dradriver.webhook" -}}{{ include "dradriver.fullname" . }}-webhook{{- end -}}
{{- define "dradriver.webhookSecret" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-tls" (include "dradriver.webhook" .)) -}}
{{- end -}}

{{/* The image both components run. */}}
{{- define "dradriver.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Labels every object carries; "component" says which part it belongs to. */}}
{{- define "dradriver.labels" -}}
app.kubernetes.io/part-of: dradriver
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/*
The DeviceClasses the chart installs, in the order of dradriver.webhook.registration
(device_classes): the webhook's matchConditions name them. Both names are listed even
when a class is not installed, so the rendered conditions stay those the Python
registration renders (a unit test compares them).
*/}}
{{- define "dradriver.deviceClassNames" -}}
{{- list .Values.driverName (printf "%s-mock-extended-resource" .Values.driverName) | toJson -}}
{{- end -}}

{{/*
The DeviceClasses whose immediate claims the allocation-finalizer policy marks: the
chart's own (both names, as above), those of the host profiles with an extended resource
(deviceclass-host-profiles.yaml) and controller.allocationDeviceClasses.
*/}}
{{- define "dradriver.allocationClassNames" -}}
{{- $d := .Values.driverName }}
{{- $names := include "dradriver.deviceClassNames" . | fromJsonArray }}
{{- if .Values.kubeletPlugin.enabled }}
{{- range ((.Values.kubeletPlugin.config | default dict).sources | default list) }}
{{- with .host }}{{ if .extendedResourceName }}{{ $names = append $names (printf "%s-%s" $d .name) }}{{ end }}{{ end }}
{{- end }}
{{- end }}
{{- concat $names (.Values.controller.allocationDeviceClasses | default list) | uniq | toJson -}}
{{- end -}}

{{/*
Environment of a pod that reaches the apiserver somewhere else than through the
"kubernetes" Service (a cluster without a Service network, like dradriver's local
cluster): the in-cluster client reads KUBERNETES_SERVICE_HOST/PORT.
*/}}
{{- define "dradriver.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | quote }}
{{- end }}
{{- end -}}
