"""Training and evaluation: DeiT recipe for classification, DETR set loss for detection."""
