"""GLAM (Global-Local Activation Maps) components for MONAI.

The bundle's custom code, imported from the configs as ``scripts.…`` (the model-zoo idiom).
"""
