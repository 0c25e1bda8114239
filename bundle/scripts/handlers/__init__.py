"""Ignite handlers of the bundle (used from the configs as ``scripts.handlers.…``)."""

from .metrics import PxAP, SoftDice

__all__ = ["PxAP", "SoftDice"]
