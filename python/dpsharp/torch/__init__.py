"""Optional PyTorch integration. Importing this package does not import torch."""

from __future__ import annotations
