"""The cluster model store: which node hosts it, this node's binding to it, fetching into
it, staging copies from it and evicting them. Built on `skulk.models`."""
