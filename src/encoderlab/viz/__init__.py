"""Pictures: training curves, attention maps."""
