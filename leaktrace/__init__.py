"""leaktrace: find which native memory grows in live (vLLM) processes, who maps it and why."""

__version__ = "0.1.0"
