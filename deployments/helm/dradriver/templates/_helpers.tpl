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

{{/*
What the node plugin's configuration needs from the host, as JSON (the DaemonSet reads
it; docs/security.md "Node plugin privileges" has the table):
  shim: the device-plugin shim runs (devicePlugin.enabled, or a host profile's
    extendedResourceName served through the device plugin: extendedResources is not "dra"),
    so the kubelet's device-plugins (rw) and pod-resources (ro) directories are mounted;
  mock: a static source makes mock device nodes (mockDir): CAP_MKNOD and the mock dir;
  capabilities: MKNOD for mock, what each hook declares (hooks.setup, hooks.teardown,
    devicePlugin.preStart: capabilities) and kubeletPlugin.extraCapabilities, sorted;
  readOnlyDirs: host directories the sources read, mounted read-only at the same path:
    /dev (or a host profile's devRoot) for host profiles and devglob globs under /dev
    (the plugin stats nodes and reads by-id links, never opens a device), the literal
    part of other devglob globs, and a sysfsRoot other than /sys (the runtime's own /sys
    is read-only and enough).
*/}}
{{- define "dradriver.pluginNeeds" -}}
{{- $p := .Values.kubeletPlugin }}
{{- $c := $p.config }}
{{- $shim := false }}
{{- if ($c.devicePlugin | default dict).enabled }}{{ $shim = true }}{{ end }}
{{- $mock := false }}
{{- $caps := list }}
{{- $dirs := list }}
{{- range $c.sources }}
  {{- if and .static .static.mockDir }}{{ $mock = true }}{{ end }}
  {{- if .devglob }}
    {{- $literal := regexReplaceAll "/[^/]*[][*?].*$" .devglob.glob "" }}
    {{- if eq $literal .devglob.glob }}{{ $literal = dir .devglob.glob }}{{ end }}
    {{- if or (eq $literal "/dev") (hasPrefix "/dev/" $literal) }}{{ $literal = "/dev" }}{{ end }}
    {{- $dirs = append $dirs $literal }}
  {{- end }}
  {{- if .host }}
    {{- $dirs = append $dirs (.host.devRoot | default "/dev") }}
    {{- if and .host.sysfsRoot (ne .host.sysfsRoot "/sys") }}{{ $dirs = append $dirs .host.sysfsRoot }}{{ end }}
    {{- if and .host.extendedResourceName (ne ($c.extendedResources | default "auto") "dra") }}{{ $shim = true }}{{ end }}
  {{- end }}
  {{- if and .pci .pci.sysfsRoot (ne .pci.sysfsRoot "/sys") }}{{ $dirs = append $dirs .pci.sysfsRoot }}{{ end }}
{{- end }}
{{- if $mock }}{{ $caps = append $caps "MKNOD" }}{{ end }}
{{- $hooks := $c.hooks | default dict }}
{{- range list $hooks.setup $hooks.teardown ($c.devicePlugin | default dict).preStart }}
  {{- if . }}{{ $caps = concat $caps (.capabilities | default list) }}{{ end }}
{{- end }}
{{- $caps = concat $caps $p.extraCapabilities | uniq | sortAlpha }}
{{- dict "shim" $shim "mock" $mock "capabilities" $caps "readOnlyDirs" ($dirs | uniq | sortAlpha) | toJson }}
{{- end -}}
