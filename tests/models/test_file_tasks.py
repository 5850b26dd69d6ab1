"""A researcher's own data as a task (models/tasks/userdata.py): every example checked against the file's rows
tokenised as documented, computed independently here; splits, identity, caching and refusals; a short training run
of each kind through ``ablations.train``."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml

from models.config import ConfigError
from models.tasks import BOS, EOS, SEP, TASKS, DataUnavailable, make_task
from record.spec import SpecError, resolve_run
from record.spec.overrides import load_run
from record.spec.study import load_study

FIRST = 4  # the first task symbol (PAD, BOS, EOS, SEP before it)
TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}


def by_bytes(text: str) -> list[int]:
    """Byte level, as documented: each UTF-8 byte, after the four special tokens."""
    return [FIRST + b for b in text.encode("utf-8")]


def by_chars(alphabet: list[str]):
    return lambda text: [FIRST + alphabet.index(c) for c in text]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def rows(task, split: str) -> list[dict]:
    return task.build(split).to_list()


PAIRS = {  # question -> answer; non-ASCII, an integer answer, a repeated answer
    "train": [{"q": "abc", "a": "cba"}, {"q": "héllo", "a": "olléh"}, {"q": "12", "a": 21}, {"q": "xy", "a": "yx"}],
    "validation": [{"q": "pq", "a": "qp"}, {"q": "zz", "a": "zz"}],
    "test": [{"q": "mnop", "a": "ponm"}],
}


@pytest.fixture
def pair_files(tmp_path) -> dict[str, str]:
    return {s: str(write_jsonl(tmp_path / f"{s}.jsonl", r)) for s, r in PAIRS.items()}


@pytest.fixture(autouse=True)
def _datasets_cache_here(tmp_path, monkeypatch):
    """``load_dataset`` of a builder writes its cache under the test's folder, not the home directory."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


# --- each format and kind, tokenised as documented ------------------------------------------------------------------


def test_jsonl_pairs_per_split_are_the_file_s_rows_tokenised(pair_files):
    task = make_task({"name": "data_seq2seq", "source": pair_files, "src_column": "q", "tgt_column": "a"})
    for split, given in PAIRS.items():
        assert rows(task, split) == [{"src": by_bytes(r["q"]), "tgt": by_bytes(str(r["a"]))} for r in given]
    assert task.kind == "seq2seq" and task.archs == ("encoder_decoder",)
    assert task.vocab_size == FIRST + 256
    assert task.max_length == len("héllo".encode()) + 1  # the longest target with its end token
    assert task.target_positions("test") == 5 and task.target_positions("validation") == 3


def test_char_level_takes_the_sorted_characters_of_every_split(pair_files):
    task = make_task(
        {"name": "data_seq2seq", "source": pair_files, "src_column": "q", "tgt_column": "a", "level": "char"}
    )
    alphabet = sorted({c for split in PAIRS.values() for r in split for c in r["q"] + str(r["a"])})
    enc = by_chars(alphabet)
    assert task.vocab_size == FIRST + len(alphabet)
    assert rows(task, "train") == [{"src": enc(r["q"]), "tgt": enc(str(r["a"]))} for r in PAIRS["train"]]
    assert task.max_length == 6  # héllo is five characters


@pytest.mark.parametrize("delimiter,suffix", [(",", "csv"), ("\t", "tsv")])
def test_csv_classification_labels_become_sorted_class_ids(tmp_path, delimiter, suffix):
    """Class ids in sorted order of the training labels: integers by value (2 before 10), then text."""
    train = [["great film", "pos"], ["awful, truly", "neg"], ["so-so", "10"], ["fine", "2"], ["ok", "pos"]]
    validation = [["bad", "neg"], ["good", "pos"]]
    test = [["meh", "2"], ["wow", "10"]]
    files = {
        s: str(write_csv(tmp_path / f"{s}.{suffix}", ["review", "stars"], r, delimiter))
        for s, r in (("train", train), ("validation", validation), ("test", test))
    }
    task = make_task({"name": "data_classify", "source": files, "text_column": "review", "label_column": "stars"})
    assert task.classes == ("2", "10", "neg", "pos") and task.n_classes == 4
    ids = {name: i for i, name in enumerate(["2", "10", "neg", "pos"])}
    for split, given in (("train", train), ("validation", validation), ("test", test)):
        assert rows(task, split) == [{"tokens": [SEP, *by_bytes(text)], "label": ids[label]} for text, label in given]
    assert task.max_length == 1 + len("awful, truly")  # the quoted comma is text
    assert task.build("train").features["label"].names == ["2", "10", "neg", "pos"]


def test_text_file_rows_are_its_non_empty_lines(tmp_path):
    lines = ["the cat sat", "", "on the mat", "a dog ran", "", "in the park", "x"] * 3
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = {"name": "data_lm", "source": {"train": str(path), "validation": str(path), "test": str(path)}}
    task = make_task(spec)
    expected = [{"tokens": [BOS, *by_bytes(line), EOS]} for line in lines if line]
    assert rows(task, "train") == expected == rows(task, "test")
    assert task.max_length == len("the cat sat") + 1  # the model reads tokens[:-1]
    assert task.kind == "lm" and task.n_classes is None


def test_one_json_array_of_objects_reads_like_json_lines(tmp_path):
    items = [{"text": f"row {i}", "label": i % 2} for i in range(20)]
    (tmp_path / "a.json").write_text(json.dumps(items))
    lines = write_jsonl(tmp_path / "b.jsonl", items)
    a = make_task({"name": "data_classify", "source": str(tmp_path / "a.json")})
    b = make_task({"name": "data_classify", "source": str(lines)})
    assert [rows(a, s) for s in a.splits] == [rows(b, s) for s in b.splits]


# --- splits cut from one file ---------------------------------------------------------------------------------------


def test_fraction_splits_are_disjoint_deterministic_and_drawn_by_the_data_seed(tmp_path):
    """One file: its rows shuffled by data_seed, round(n x val_fraction) to validation, the next round(n x
    test_fraction) to test, the rest to train, each in the file's order (the documented rule, computed here)."""
    given = [{"text": f"sentence number {i}"} for i in range(47)]
    path = write_jsonl(tmp_path / "all.jsonl", given)

    def split_rows(seed: int, val: float = 0.1, test: float = 0.2) -> dict[str, list]:
        spec = {"name": "data_lm", "source": str(path), "data_seed": seed, "val_fraction": val, "test_fraction": test}
        task = make_task(spec)
        return {s: rows(task, s) for s in task.splits}

    first = split_rows(0)
    order = list(range(47))
    random.Random(0).shuffle(order)
    cut = {"validation": sorted(order[:5]), "test": sorted(order[5:14]), "train": sorted(order[14:])}  # 4.7, 9.4
    for split, indices in cut.items():
        assert first[split] == [{"tokens": [BOS, *by_bytes(given[i]["text"]), EOS]} for i in indices]
    keys = {s: {tuple(r["tokens"]) for r in first[s]} for s in first}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert sum(map(len, keys.values())) == 47
    assert split_rows(0) == first  # deterministic
    assert split_rows(1) != first and sorted(map(len, split_rows(1).values())) == [5, 9, 33]


def test_a_missing_split_is_cut_from_train_and_the_others_are_read(tmp_path, pair_files):
    """A validation file without a test file: test is cut from train, validation read as it is."""
    big = write_jsonl(tmp_path / "big.jsonl", [{"q": f"q{i}", "a": f"a{i}"} for i in range(30)])
    task = make_task(
        {
            "name": "data_seq2seq",
            "source": {"train": str(big), "validation": pair_files["validation"]},
            "src_column": "q",
            "tgt_column": "a",
        }
    )
    assert len(rows(task, "validation")) == 2 and len(rows(task, "test")) == 3 and len(rows(task, "train")) == 27
    assert "test 3 (cut from train)" in task.describe()


# --- identity and caching -------------------------------------------------------------------------------------------


def _run(task: dict) -> dict:
    return {"task": task, "model": TINY_MODEL, "training": {"max_steps": 4, "batch_size": 4}}


def test_the_cell_follows_the_file_s_contents_not_its_path(tmp_path, pair_files):
    """config_hash names a local file by its bytes: the same file at another path is the same cell, an edited file
    another; for plain files, files per split and a builder's data_files alike."""
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [{"text": f"line {i}", "label": i % 3} for i in range(30)])
    moved = tmp_path / "elsewhere" / "renamed.jsonl"

    def hashes(path: Path) -> list[str]:
        sources = [str(path), {"train": str(path)}, {"builder": "json", "data_files": {"train": str(path)}}]
        return [resolve_run(_run({"name": "data_classify", "source": s})).config_hash() for s in sources]

    before = hashes(data)
    assert len(set(before)) == 3  # three spellings of the source: three tasks (cut alike, read differently)
    moved.parent.mkdir()
    shutil.move(data, moved)
    assert hashes(moved) == before
    write_jsonl(moved, [{"text": f"line {i}!", "label": i % 3} for i in range(30)])  # edited: other data
    assert not set(hashes(moved)) & set(before)


def test_settings_that_change_no_example_are_the_same_cell(tmp_path):
    """The format its extension implies, and a max_len the data keeps within (it refuses, it never changes an
    example), are the cell of leaving them out; a format that reads the file otherwise is other data."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"line {i}"} for i in range(20)])

    def cell(**task) -> str:
        return resolve_run(_run({"name": "data_lm", "source": str(path), **task})).config_hash()

    assert cell() == cell(format="jsonl") == cell(format="json") == cell(max_len=500)
    assert len({cell(), cell(format="text"), cell(level="char")}) == 3


def test_an_edited_file_is_generated_again_and_an_unchanged_one_read_from_the_cache(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"source": f"s{i}", "target": f"t{i}"} for i in range(20)])
    cache = str(tmp_path / "cache")
    spec = {"name": "data_seq2seq", "source": str(path)}
    first = make_task(spec).build("train", cache)
    again = make_task(spec).build("train", cache)
    assert again._fingerprint == first._fingerprint
    arrows = len(list((tmp_path / "cache").rglob("*.arrow")))
    write_jsonl(path, [{"source": f"s{i}", "target": f"T{i}"} for i in range(20)])
    edited = make_task(spec).build("train", cache)
    assert edited._fingerprint != first._fingerprint
    assert edited.to_list() != first.to_list() and edited.to_list()[0]["tgt"][0] == FIRST + ord("T")
    assert len(list((tmp_path / "cache").rglob("*.arrow"))) == arrows + 1


def test_relative_paths_are_read_from_the_folder_of_the_file_that_wrote_them(tmp_path, monkeypatch):
    """A run file's paths from its folder, a study's axis values from the study's, a base file's from its own: the
    same files from any working directory, recorded as absolute paths."""
    data = write_jsonl(tmp_path / "data" / "pairs.jsonl", [{"source": f"s{i}", "target": f"t{i}"} for i in range(20)])
    other = tmp_path / "data" / "other.jsonl"
    write_jsonl(other, [{"source": f"x{i}", "target": f"y{i}"} for i in range(20)])
    runs = tmp_path / "runs"
    runs.mkdir()
    run = _run({"name": "data_seq2seq", "source": "../data/pairs.jsonl"})
    (runs / "r.yaml").write_text(yaml.safe_dump(run))
    study = {"name": "s", "base": "r.yaml", "design": {"grid": {"task.source": ["../data/pairs.jsonl", "o.jsonl"]}}}
    shutil.copy(other, runs / "o.jsonl")
    (runs / "s.yaml").write_text(yaml.safe_dump(study))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert load_run(runs / "r.yaml").task_spec["source"] == str(data)
    cells = load_study(runs / "s.yaml").cells
    assert [c.run.task_spec["source"] for c in cells] == [str(data), str(runs / "o.jsonl")]
    inline = {**run, "task": {"name": "data_seq2seq", "source": "pairs.jsonl"}}  # beside the study
    (tmp_path / "data" / "i.yaml").write_text(
        yaml.safe_dump({**study, "base": inline, "design": {"grid": {"task.level": ["byte"]}}})
    )
    assert load_study(tmp_path / "data" / "i.yaml").cells[0].run.task_spec["source"] == str(data)


# --- datasets builders ----------------------------------------------------------------------------------------------


def test_a_json_builder_with_data_files_gives_the_plain_files_examples(tmp_path):
    """Text answers only: datasets reads a column of text and integers mixed as JSON text (21 and "cba" as '21' and
    '"cba"'), this task as text (the integer in decimal)."""
    texts = {s: [{"q": r["q"], "a": str(r["a"])} for r in given] for s, given in PAIRS.items()}
    pair_files = {s: str(write_jsonl(tmp_path / f"{s}.jsonl", r)) for s, r in texts.items()}
    plain = make_task({"name": "data_seq2seq", "source": pair_files, "src_column": "q", "tgt_column": "a"})
    built = make_task(
        {
            "name": "data_seq2seq",
            "source": {"builder": "json", "data_files": pair_files},
            "src_column": "q",
            "tgt_column": "a",
        }
    )
    assert [rows(built, s) for s in built.splits] == [rows(plain, s) for s in plain.splits]


def test_a_csv_builder_on_one_file_gives_the_plain_file_s_examples_and_splits(tmp_path):
    """pandas reads the integer labels as integers, Python's csv module as text: the same class names either way."""
    given = [[f"review number {i}", [3, 1, 10][i % 3]] for i in range(40)]
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], given)
    plain = make_task({"name": "data_classify", "source": str(path), "data_seed": 3})
    built = make_task({"name": "data_classify", "source": {"builder": "csv", "data_files": str(path)}, "data_seed": 3})
    assert plain.classes == built.classes == ("1", "3", "10")
    assert [rows(built, s) for s in built.splits] == [rows(plain, s) for s in plain.splits]


def test_a_local_folder_of_split_files_is_a_builder_named_by_its_files(tmp_path):
    """A folder of train/validation/test files: datasets names the splits by the files' names; the cell names the
    folder by its files' names and bytes, wherever it lies."""
    folder = tmp_path / "pairs"
    folder.mkdir()
    for split in PAIRS:
        write_jsonl(folder / f"{split}.jsonl", [{"q": r["q"], "a": str(r["a"])} for r in PAIRS[split]])
    spec = {"name": "data_seq2seq", "src_column": "q", "tgt_column": "a"}
    built = make_task({**spec, "source": {"builder": str(folder)}})
    assert [len(rows(built, s)) for s in built.splits] == [4, 2, 1]
    assert rows(built, "test") == [{"src": by_bytes("mnop"), "tgt": by_bytes("ponm")}]
    here = resolve_run(_run(built.to_dict())).config_hash()
    shutil.copytree(folder, tmp_path / "copy")
    assert resolve_run(_run({**spec, "source": {"builder": str(tmp_path / "copy")}})).config_hash() == here
    (tmp_path / "copy" / "test.jsonl").rename(tmp_path / "copy" / "validation2.jsonl")  # same bytes, other splits
    assert TASKS["data_seq2seq"].content_spec({**spec, "source": {"builder": str(tmp_path / "copy")}}) != (
        TASKS["data_seq2seq"].content_spec({**spec, "source": {"builder": str(folder)}})
    )


def test_a_hub_dataset_that_cannot_be_loaded_names_the_local_fix(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataUnavailable, match=r"could not load 'surely-not-a-dataset-xyz'.*use a local file") as info:
        make_task({"name": "data_lm", "source": {"builder": "surely-not-a-dataset-xyz"}})
    assert isinstance(info.value, ConfigError) and info.value.field == "source"  # a run file names its line


# --- refusals, before anything trains ---------------------------------------------------------------------------------


def _refusal_cases(tmp: Path) -> list[tuple[dict, str, str]]:
    pairs = write_jsonl(tmp / "pairs.jsonl", [{"q": f"q{i}", "a": "a" * i} for i in range(1, 21)])
    labelled = write_jsonl(tmp / "labelled.jsonl", [{"text": f"t{i}", "label": ["x", "y"][i % 2]} for i in range(20)])
    empty = tmp / "empty.jsonl"
    empty.write_text("\n")
    unseen = write_jsonl(tmp / "unseen.jsonl", [{"text": "t", "label": "z"}])
    one_class = write_jsonl(tmp / "one.jsonl", [{"text": f"t{i}", "label": "x"} for i in range(20)])
    listed = write_jsonl(tmp / "listed.jsonl", [{"text": ["not", "text"], "label": "x"}])
    bad = tmp / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n')
    ragged = tmp / "ragged.csv"
    ragged.write_text("text,label\na,x\nb,y,z\n")
    few = write_jsonl(tmp / "few.jsonl", [{"text": f"t{i}"} for i in range(4)])
    seq, cls, lm = "data_seq2seq", "data_classify", "data_lm"
    return [
        ({"name": lm, "source": str(tmp / "nope.jsonl")}, "source", r"the source file '.*nope.jsonl' does not exist"),
        ({"name": seq, "source": str(pairs)}, "src_column", r"line 1 of pairs.jsonl has no column 'source' "
         r"\(src_column\); its columns: 'q', 'a'"),
        ({"name": cls, "source": {"train": str(labelled), "validation": str(empty)}}, "source",
         r"the validation split \(file '.*empty.jsonl'\) has no rows"),
        ({"name": lm, "source": str(few)}, "val_fraction", r"cutting validation from the 4 training rows .* leaves it "
         r"empty \(4 x val_fraction=0.1 rounds to 0\)"),
        ({"name": cls, "source": {"train": str(labelled), "validation": str(unseen)}}, "label_column",
         r"line 1 of unseen.jsonl \(validation\) has the label 'z', which no training row has \(training labels: "
         r"'x', 'y'\)"),
        ({"name": cls, "source": str(one_class)}, "label_column", r"every training row .* has the label 'x'"),
        ({"name": seq, "source": str(pairs), "src_column": "q", "tgt_column": "a", "max_len": 12}, "max_len",
         r"line \d+ of pairs.jsonl \(\w+\) is \d+ tokens long .* more than max_len=12 \(9 row\(s\) are; the longest "
         r"21\): raise max_len to 21"),
        ({"name": cls, "source": str(listed)}, "text_column", r"line 1 of listed.jsonl: column 'text' is list"),
        ({"name": lm, "source": str(bad)}, "source", r"line 2 of '.*bad.jsonl' is not JSON"),
        ({"name": cls, "source": str(ragged)}, "source", r"line 3 of '.*ragged.csv' has 3 fields and its header 2"),
        ({"name": cls, "source": {"train": str(labelled), "validation": str(labelled)}, "val_fraction": 0.2},
         "val_fraction", r"val_fraction=0.2 cuts validation rows from train, and the source gives a validation"),
        ({"name": lm, "source": {s: str(few) for s in ("train", "validation", "test")}, "data_seed": 2},
         "data_seed", r"data_seed=2 shuffles the rows cut from train, and the source gives every split"),
        ({"name": lm}, "source", r"a data task needs a source"),
        ({"name": lm, "source": {"train": str(few), "dev": str(few)}}, "source", r"unknown split\(s\) \['dev'\]"),
        ({"name": lm, "source": str(tmp / "notes.md")}, "format", r"cannot tell the format of .*notes.md"),
        ({"name": lm, "source": {"builder": "json"}}, "source", r"the datasets builder 'json' reads files, and "
         r"source names none"),
        ({"name": lm, "source": {"builder": "json", "data_files": str(tmp / "no*.jsonl")}}, "source",
         r"source.data_files: '.*no\*.jsonl' matches no file"),
        ({"name": lm, "source": {"builder": "json", "data_files": str(few), "cache_dir": "/tmp"}}, "source",
         r"source.cache_dir is load_dataset's, not the data's"),
        ({"name": lm, "source": str(few), "level": "word"}, "level", r"level='word' is not a valid choice"),
    ]  # fmt: skip


def test_each_refusal_names_the_key_and_the_fix(tmp_path):
    (tmp_path / "notes.md").write_text("# notes\n")
    for spec, field, message in _refusal_cases(tmp_path):
        with pytest.raises(ConfigError, match=message) as info:
            make_task(spec)
        assert info.value.field == field, (spec, info.value)
        assert info.value.fix in str(info.value) or field == "level", info.value  # level: the valid choices


def test_a_run_file_s_data_refusal_names_its_line_before_anything_trains(tmp_path):
    write_jsonl(tmp_path / "pairs.jsonl", [{"question": "q", "answer": "a"}] * 12)
    (tmp_path / "run.yaml").write_text(
        "task:\n  name: data_seq2seq\n  source: pairs.jsonl\n  tgt_column: answer\nmodel: {d_model: 16, n_heads: 2}\n"
    )
    with pytest.raises(SpecError, match=r"run.yaml:3: task.source: line 1 of pairs.jsonl has no column 'source'"):
        load_run(tmp_path / "run.yaml")


# --- training ---------------------------------------------------------------------------------------------------


def _train(store: str, task: dict, steps: int = 6):
    from ablations.train import Tracking, train

    run = resolve_run(
        {
            "task": task,
            "model": TINY_MODEL,
            "training": {"max_steps": steps, "val_every": steps, "batch_size": 8, "warmup_steps": 2},
            "resources": {"threads": 1},
        }
    )
    return run, train(run, Tracking(store, "own data"))


def test_a_seq2seq_jsonl_file_trains_and_is_scored_by_exact_match(store, tmp_path):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdef") for _ in range(rng.randint(1, 5))) for _ in range(60)]
    path = write_jsonl(tmp_path / "reverse.jsonl", [{"source": w, "target": w[::-1]} for w in words])
    run, result = _train(store, {"name": "data_seq2seq", "source": str(path), "level": "char"})
    assert result.status == "finished", result.detail
    assert run.model.arch == "encoder_decoder" and run.model.vocab_size == FIRST + 6
    for key in ("final/val_loss", "final/val_exact_match", "test/exact_match", "test/token_acc", "test/error_at_1"):
        assert key in result.metrics


def test_a_csv_classification_file_trains_with_its_classes_and_majority(store, tmp_path):
    given = [[f"{'good' if i % 3 else 'bad'} {i}", "pos" if i % 3 else "neg"] for i in range(60)]
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], given)
    run, result = _train(store, {"name": "data_classify", "source": str(path)})
    assert result.status == "finished", result.detail
    assert run.model.arch == "encoder" and run.model.n_classes == 2
    test = make_task(run.task_spec).build("test").to_list()
    majority = max(sum(r["label"] == c for r in test) for c in (0, 1)) / len(test)
    assert result.metrics["data/test_majority"] == pytest.approx(majority)
    for key in ("final/val_accuracy", "test/accuracy", "data/val_majority"):
        assert key in result.metrics
