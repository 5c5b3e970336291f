"""The Kubernetes platforms: `config` (the sections every kind shares), `render`
(pure: config + trial -> plain objects from the templates in launchers/),
`platform` (submit, watch, stop over the client), `client` (the only module that
talks to a cluster), and one module per kind: `kubeflow`, `frameworkcontroller`,
`adaptdljob`."""
