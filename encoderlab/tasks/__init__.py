"""Fine-tuning and evaluation: text classification and regression, NER, extractive QA, sentence embeddings.

- readers.py     GLUE TSV/CSV, JSONL, CoNLL, SQuAD v1.1/v2.0, each error naming its file and line
- models.py      heads on the encoder, saved as the family's transformers XFor* folders; the BiLSTM baseline
- heads.py       each family's sequence-classification head (pooled [CLS], or a dense layer on the first token)
- base.py        what a task gives the loop (features, collate, loss, predict, score) and shared helpers
- objective.py   each task as an objective of the one training loop (train/loop.py): recipe, data, best model
- classify.py, tagging.py, qa.py, embedding.py   the four tasks
- metrics.py     accuracy/F1/MCC, Pearson/Spearman, seqeval entity F1, SQuAD EM/F1
- cli.py         `encoderlab finetune TASK` and `encoderlab evaluate TASK` (add_commands)
"""

from encoderlab.tasks.models import (BiLSTMClassifier, SentenceEmbedder, SequenceClassifier, SpanExtractor,
                                     TokenClassifier, load_backbone, load_task_model, save_task_model)
from encoderlab.tasks.objective import TrainOptions, train

__all__ = ["BiLSTMClassifier", "SentenceEmbedder", "SequenceClassifier", "SpanExtractor", "TokenClassifier",
           "TrainOptions", "load_backbone", "load_task_model", "save_task_model", "train"]
