"""The course's benchmark harness (`make bench`): see bench/__main__.py."""
