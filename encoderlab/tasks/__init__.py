"""Fine-tuning and evaluation: text classification and regression, NER, extractive QA, sentence embeddings.

The models themselves (an encoder plus a task head) are encoderlab.nn.model's, loaded and saved by
encoderlab.checkpoint; this package holds what is particular to each task.

- readers.py     GLUE TSV/CSV, JSONL, CoNLL, SQuAD v1.1/v2.0, each error naming its file and line
- base.py        what a task gives the loop (features, collate, loss, predict, score) and shared helpers
- objective.py   each task as an objective of the one training loop (train/loop.py): recipe, data, best model
- classify.py, tagging.py, qa.py, embedding.py   the four tasks
- metrics.py     accuracy/F1/MCC, Pearson/Spearman, seqeval entity F1, SQuAD EM/F1
- finetune.py    what `encoderlab finetune TASK` and `encoderlab evaluate TASK` run (encoderlab/cli parses)
"""
