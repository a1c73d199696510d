"""Pilotfish: production-first orchestration for Kubernetes.

The core package (`pilotfish.*` outside the three parts) is imported by the operators, the
scheduler extender and the admission webhooks; it never imports them.
"""

__version__ = "0.1.0"
