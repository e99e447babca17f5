"""The graph and the pass machinery: loading, graph helpers, saving, passes' base.

A regular package, not a namespace one: imported from a zip, a namespace
subpackage was found in another install of rewriter."""
