"""Gymnasium environments for setpo: ids ``setpo/MultiModalBandit-v0`` and ``setpo/Countdown-v0``."""
