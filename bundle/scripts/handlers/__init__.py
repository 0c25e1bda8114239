"""Ignite handlers of the bundle (used from the configs as ``scripts.handlers.…``)."""

from .metrics import PointingGame, PxAP, SoftDice

__all__ = ["PointingGame", "PxAP", "SoftDice"]
