"""RoPE numbers that are no finite positive number (JSON's NaN and Infinity, which Python's json
reads, or a product past a float's range) are a one-line config error naming the key: they were
OverflowError and ValueError tracebacks from info, plan and generate (int(inf), int(nan))."""

from __future__ import annotations

import json

import pytest

from inferlab.cli import main
from inferlab.errors import ModelLoadError
from inferlab.models.config import ModelConfig

CONFIG = ('{"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 8, '
          '"intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, '
          '"max_position_embeddings": 64, "rope_parameters": %s}')
CASES = [  # the rope_parameters as config.json spells them, and the error's words
    ('{"rope_type": "linear", "factor": Infinity, "rope_theta": 10000.0}',
     "rope scaling 'linear' needs a positive number factor, got inf"),
    ('{"rope_type": "linear", "factor": NaN, "rope_theta": 10000.0}',
     "rope scaling 'linear' needs a positive number factor, got nan"),
    ('{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -Infinity}',
     "rope scaling 'yarn' needs a positive number original_max_position_embeddings, got -inf"),
    ('{"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": NaN}',
     "rope scaling 'llama3' needs a positive number original_max_position_embeddings, got nan"),
    # each finite, the stretched context 1e309 is not
    ('{"rope_type": "yarn", "factor": 1e308, "original_max_position_embeddings": 10}',
     "rope scaling 'yarn': factor × original_max_position_embeddings overflows"),
    ('{"rope_type": "linear", "factor": 1%s}' % ("0" * 400),  # a JSON integer past a float's range
     "rope scaling 'linear': factor × max_position_embeddings overflows"),
]


@pytest.mark.parametrize(("rope", "message"), CASES)
def test_a_non_finite_rope_number_is_a_config_error(rope: str, message: str) -> None:
    with pytest.raises(ModelLoadError) as failed:
        ModelConfig.from_hf_dict(json.loads(CONFIG % rope))
    assert message in str(failed.value) and "\n" not in str(failed.value)


@pytest.mark.parametrize("command", [["info"], ["plan", "--hardware", "H100-SXM"]])
@pytest.mark.parametrize(("rope", "message"), [CASES[0], CASES[4]])
def test_the_commands_say_it_in_one_line(tmp_path, capsys, command, rope: str, message: str) -> None:
    (tmp_path / "config.json").write_text(CONFIG % rope)
    assert main([*command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_large_finite_stretch_still_counts() -> None:
    """vLLM multiplies max_position_embeddings by the factor, however large (no cap here)."""
    rope = '{"rope_type": "yarn", "factor": 1e300, "original_max_position_embeddings": 10}'
    assert ModelConfig.from_hf_dict(json.loads(CONFIG % rope)).max_positions == int(1e301)
