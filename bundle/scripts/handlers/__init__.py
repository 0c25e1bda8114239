"""Ignite handlers of the bundle (used from the configs as ``scripts.handlers.…``)."""

from . import finite, panels, throughput, training_state
from .loss_terms import LossTerms
from .metrics import FROC, PointingGame, PxAP, SoftDice

__all__ = ["finite", "panels", "throughput", "training_state", "LossTerms", "FROC", "PointingGame", "PxAP", "SoftDice"]
