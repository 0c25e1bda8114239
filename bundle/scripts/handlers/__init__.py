"""Ignite handlers of the bundle (used from the configs as ``scripts.handlers.…``)."""

from .loss_terms import LossTerms
from .metrics import PointingGame, PxAP, SoftDice

__all__ = ["LossTerms", "PointingGame", "PxAP", "SoftDice"]
