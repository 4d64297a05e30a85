"""Per-token text conditioning (umT5, as Wan's pipeline gives it): a tiny UMT5 encoder built from
Wan2.1's published text_encoder configuration (shrunk, random weights) and a tokenizer trained here,
saved in the diffusers pipeline layout (``text_encoder/`` + ``tokenizer/``), loaded through vidassets
and compared with diffusers' own ``WanPipeline.encode_prompt`` on the same snapshot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidassets.models.placement import Placement
from vidassets.models.text_encoder import T5TokenEncoder, padded_states

CAPTIONS = ["A person rides a bike down a hill, the camera pans left.",
            "Two people talk in a kitchen at night  with   warm light.",
            "a dog"]


def tiny_wan_text_encoder(root: Path) -> Path:
    """Wan2.1-T2V-*-Diffusers' ``text_encoder`` config (umT5-XXL) shrunk, and a Unigram tokenizer with
    umT5's special tokens trained on a few captions, saved as the pipeline snapshot lays them out."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    corpus = [c.lower() for c in CAPTIONS] + ["a car drives on a road", "the city skyline at dusk", "a green field"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(corpus * 4, trainers.UnigramTrainer(vocab_size=90, special_tokens=["<pad>", "</s>", "<unk>"],
                                                                unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                 extra_ids=0).save_pretrained(root / "tokenizer")
    config = transformers.UMT5Config(  # published: d_model 4096, d_ff 10240, 24 layers, 64 heads, vocab 256384
        vocab_size=tok.get_vocab_size(), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        dense_act_fn="gelu_new", is_gated_act=True, layer_norm_epsilon=1e-6, tie_word_embeddings=False,
        scalable_attention=True, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(0)
    transformers.UMT5EncoderModel(config).save_pretrained(root / "text_encoder")
    return root


def wan_prompt_embeds(root: Path, texts: list[str], max_tokens: int) -> torch.Tensor:
    """What diffusers' WanPipeline hands its transformer for these prompts (its own code, same snapshot)."""
    import transformers
    from diffusers import WanPipeline

    pipe = WanPipeline(tokenizer=transformers.AutoTokenizer.from_pretrained(root / "tokenizer"),
                       text_encoder=transformers.UMT5EncoderModel.from_pretrained(root / "text_encoder"),
                       vae=None, scheduler=None)
    embeds, _ = pipe.encode_prompt(texts, do_classifier_free_guidance=False, max_sequence_length=max_tokens,
                                   device=torch.device("cpu"))
    return embeds


@pytest.fixture(scope="module")
def wan_text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_wan_text_encoder(tmp_path_factory.mktemp("wan-text"))


@pytest.mark.parametrize("states_dtype", ["fp32", "bf16"])
def test_token_states_equal_wan_pipeline(wan_text_dir: Path, states_dtype: str) -> None:
    encoder = T5TokenEncoder(Placement(), str(wan_text_dir), max_tokens=24, states_dtype=states_dtype)
    expected = wan_prompt_embeds(wan_text_dir, CAPTIONS, 24)
    got = encoder.token_states(CAPTIONS)
    for text_states, want in zip(got, expected, strict=True):
        padded, mask = padded_states(text_states.states, 24)
        assert padded.shape == (24, 32) and mask.dtype == torch.bool
        assert int(mask.sum()) == text_states.tokens > 0
        assert not padded[~mask].any()  # zero past the text, as the pipeline pads
        if states_dtype == "fp32":
            torch.testing.assert_close(padded, want, rtol=1e-5, atol=1e-6)
        else:  # the pipeline's states cast to bf16 (within one bf16 rounding step: fp32 sums differ in order)
            assert padded.dtype == torch.bfloat16
            torch.testing.assert_close(padded.float(), want.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-6)
        pooled = text_states.pooled
        assert pooled.shape == (32,) and abs(float(np.linalg.norm(pooled)) - 1) < 1e-5


def test_truncates_to_the_model_text_length(wan_text_dir: Path) -> None:
    encoder = T5TokenEncoder(Placement(), str(wan_text_dir), max_tokens=6)
    (states,) = encoder.token_states([CAPTIONS[0]])
    assert states.tokens == 6
    torch.testing.assert_close(padded_states(states.states, 6)[0].float(),
                               wan_prompt_embeds(wan_text_dir, [CAPTIONS[0]], 6)[0].to(torch.bfloat16).float(),
                               rtol=2**-7, atol=1e-6)


def test_a_snapshot_without_an_encoder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="text_embeddings.model_path"):
        T5TokenEncoder(Placement(), str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ValueError, match="bert"):
        T5TokenEncoder(Placement(), str(tmp_path))


def test_rows_and_shards_carry_token_states_a_wan_trainer_reads(demo_bucket: Path, tmp_path: Path) -> None:
    """The whole graph with the umT5 encoder on real footage: each text_embeddings row names its
    caption's stored token states; the shards carry them; the plan loader and energon's cooker give
    (B, max_tokens, dim) zero-padded states + mask equal to Wan's pipeline on the caption text."""
    import json

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from vidassets.curate.selection import load_recipe
    from vidassets.derive.text_embeddings import load_states
    from vidassets.storage import TableStore, open_object_store
    from vidassets.train.build import build_plan, read_index
    from vidassets.train.energon_reader import VidassetsTaskEncoder
    from vidassets.train.loader import PlanDataset
    from vidassets.train.snapshot import read_snapshot, snapshot_versions
    from vidassets_tests.conftest import graph_settings, run_graph, small_bucket

    text_dir = tiny_wan_text_encoder(tmp_path / "wan-text")
    small_bucket(demo_bucket, tmp_path)
    recipe = load_recipe().model_dump()  # every clip passes
    recipe.update(score_rules=[], perceptual_dedup={"enabled": False}, semantic_dedup={"enabled": False})
    (tmp_path / "all.yaml").write_text(json.dumps(recipe))
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{
        "selection.recipe": str(tmp_path / "all.yaml"), "text_embeddings.model": "t5_encoder",
        "text_embeddings.model_path": str(text_dir), "text_embeddings.max_tokens": 64,
        "train.shard_mb": 0.05, "train.global_batch": 2, "train.world_size": 1, "train.total_steps": 4})
    run_graph(settings, tmp_path)
    objects = open_object_store(str(tmp_path / "store"))
    rows = TableStore(objects).read_all("text_embeddings")
    assert len(rows) and rows.token_key.notna().all() and (rows.max_tokens == 64).all()
    assert "t5-tokens" in rows.producer_version.iloc[0] and "tokens64+states-bf16" in rows.producer_version.iloc[0]
    run_graph(settings, tmp_path, select=["dataset_snapshot", "training_shards", "train_plan"])
    version = snapshot_versions(objects)[-1]
    samples = read_snapshot(objects, version).set_index("clip_id")
    index = read_index(objects, version)
    root = tmp_path / "store" / f"shards/v{version}"
    meta = json.loads((root / "shards.json").read_text())
    assert meta["text_states"] == {"max_tokens": 64, "dtype": "bfloat16"}
    plan = build_plan(objects, version, settings.train)
    batch = PlanDataset(plan, root, index, rank=0, world_size=1, steps=1).batch(0)
    states, mask = batch["text_states"], batch["text_states_mask"]
    assert states.shape == (2, 64, 32) and states.dtype == torch.bfloat16 and mask.shape == (2, 64)
    texts = [json.loads(samples.loc[c, "captions"])[level] for c, level in zip(batch["clip_ids"], batch["caption_levels"],
                                                                               strict=True)]
    want = wan_prompt_embeds(text_dir, texts, 64).to(torch.bfloat16)
    torch.testing.assert_close(states.float(), want.float(), rtol=2**-7, atol=1e-6)
    assert torch.equal(mask, want.float().abs().sum(-1) > 0)  # the mask is the text's own tokens
    stored, max_tokens = load_states(objects, rows.token_key.iloc[0])
    assert max_tokens == 64 and stored.dtype == torch.bfloat16 and stored.shape[1] == 32
    worker = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_loader(get_train_dataset(str(root / index.bucket.iloc[0]), batch_size=1, shuffle_buffer_size=None,
                                          max_samples_per_sequence=None, worker_config=worker,
                                          task_encoder=VidassetsTaskEncoder()))
    cooked = next(iter(loader))[0]
    assert cooked["text_states"].shape == (64, 32) and cooked["text_states_mask"].sum() == \
        cooked["meta"]["text_states"]["tokens"][plan.caption_default]

    # the NeMo AutoModel latent cache, read by NeMo's own TextToVideoDataset and bucket sampler
    import subprocess
    import sys

    from nemo_automodel.components.datasets.diffusion.sampler import SequentialBucketSampler
    from nemo_automodel.components.datasets.diffusion.text_to_video_dataset import TextToVideoDataset

    from vidassets.derive.latents import bucket_shape, load_latents

    out = tmp_path / "nemo"
    proc = subprocess.run([str(Path(sys.executable).parent / "vidassets"), "export", "nemo", "--snapshot", str(version),
                           "--to", str(out), "--store", str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["samples"] == len(samples)
    dataset = TextToVideoDataset(str(out), model_type="wan")
    assert len(dataset) == len(samples)
    batches = list(SequentialBucketSampler(dataset, base_batch_size=1, shuffle_buckets=False, num_replicas=1, rank=0))
    assert sorted(i for b in batches for i in b) == list(range(len(samples)))
    for i in range(len(dataset)):
        item, meta = dataset[i], dataset.metadata[i]
        sample = samples.loc[meta["clip_id"]]
        stored, _ = load_latents(objects, sample.latent_key)
        assert torch.equal(item["video_latents"], stored.unsqueeze(0))  # (1, C, T, H, W), the stored dtype
        frames, width, height = bucket_shape(sample.bucket)
        assert tuple(item["bucket_resolution"].tolist()) == (width, height) and meta["num_frames"] == frames
        text = json.loads(sample.captions)[sample.caption_level]
        assert meta["prompt"] == text
        want = wan_prompt_embeds(text_dir, [text], 64).to(torch.bfloat16)  # (1, 64, dim), as Wan's pipeline
        assert item["text_embeddings"].shape == want.shape
        torch.testing.assert_close(item["text_embeddings"].float(), want.float(), rtol=2**-7, atol=1e-6)
        assert torch.equal(item["text_mask"].bool(), want.float().abs().sum(-1) > 0)
