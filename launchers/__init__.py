"""Job templates: YAML data, not code. Each file is the Kubernetes object one
trial becomes on a platform (PyTorchJob, TFJob, Framework, AdaptDLJob, and the
ConfigMap, Secret and claims beside them); trialkit/platforms/kubernetes/render.py
fills them. Not to be confused with trialkit/launch/, the in-container
launchers that start a trial's distributed workers. Shipped in the package as
trialkit.launchers; a user may point a config at a template of their own."""
