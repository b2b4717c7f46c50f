"""Fine-tuning and evaluation (finetune.py runs `encoderlab finetune` and `evaluate`): classification and regression,
NER, extractive QA, sentence embeddings, each a Task (base.py) trained as an objective of the one loop (objective.py);
the models themselves are encoderlab.nn.model's."""
