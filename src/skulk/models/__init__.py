"""Model files: cards, the Hugging Face hub, downloads, companions, disk admission and the
generated tiny models. Independent of the cluster's model store (which builds on it)."""
