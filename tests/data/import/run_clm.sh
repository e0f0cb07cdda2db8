# Fine-tune GPT-2 medium on wikitext with the transformers example script, 4 GPUs on one node.
torchrun --nproc_per_node 4 run_clm.py \
    --model_name_or_path gpt2-medium \
    --dataset_name wikitext \
    --dataset_config_name wikitext-2-raw-v1 \
    --per_device_train_batch_size 8 \
    --gradient_accumulation_steps 2 \
    --block_size 1024 \
    --learning_rate 5e-5 \
    --lr_scheduler_type linear \
    --warmup_steps 50 \
    --max_steps 2000 \
    --weight_decay 0.01 \
    --bf16 \
    --gradient_checkpointing \
    --do_train \
    --output_dir /tmp/test-clm  # where checkpoints go
