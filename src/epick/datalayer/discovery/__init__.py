"""Where endpoints come from: a static list, or Kubernetes."""
