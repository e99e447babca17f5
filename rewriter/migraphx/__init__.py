"""MIGraphX: profile data, the static check, the backend (a child process), the target step.

A regular package, not a namespace one: imported from a zip, a namespace
subpackage was found in another install of rewriter."""
