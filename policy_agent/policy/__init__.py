"""Network policy: the model, manifest loading and label selectors."""
