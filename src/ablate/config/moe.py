"""The built-in Llama's mixture-of-experts feed-forward (`model.moe`, model/moe.py), checked when composed. Null:
a dense SwiGLU. Defaults and their sources:
- softmax over the experts' router logits, the top k kept and renormalised (Mixtral, Jiang et al. 2024, arXiv
  2401.04088: 8 experts, top 2);
- the auxiliary load-balancing loss, per sequence (DeepSeek-V3's complementary sequence-wise balance loss, arXiv
  2412.19437 eq. 17-20: alpha x sum_i f_i P_i with f_i = E / (k T) x tokens routed to i, P_i the mean router
  probability of i over the sequence's T tokens), alpha 0.01 (Switch Transformer, Fedus et al. 2021, arXiv
  2101.03961 sec. 2.2): a mean over sequences, so data-parallel ranks sum to one rank's exactly;
- capacity: null routes every token (dropless, MegaBlocks, Gale et al. 2022); a factor c keeps at most
  ceil(c x k x T_rank / E) tokens per expert of a rank's micro-batch (GShard, Lepikhin et al. 2020), the rest
  dropped (their expert output zero, the residual carries them);
- balance: `aux_loss` adds the balance loss above; `bias` is DeepSeek-V3's auxiliary-loss-free balancing (arXiv
  2412.19437 sec. 2.1.2): a per-expert bias added to the router's scores for the top-k choice only, moved after
  each optimizer step by bias_update (their gamma, 0.001) towards the experts the step loaded least, over every
  data-parallel rank's tokens; no balance loss;
- shared experts: always-on SwiGLUs of the experts' hidden size beside the routed ones (DeepSeekMoE, Dai et al.
  2024, arXiv 2401.06066);
- matmul: `loop` runs each expert's SwiGLU on its tokens in turn; `grouped` one torch._grouped_mm per weight
  (torchtitan's GroupedExperts) where the device has it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ablate.config.errors import ConfigError
from ablate.config.fields import check_ranges, choice, num

MATMULS = ("loop", "grouped")
BALANCES = ("aux_loss", "bias")


@dataclass
class MoEConfig:
    experts: int = num(8, 1)              # routed experts per MoE layer
    top_k: int = num(2, 1)                # experts each token is sent to
    shared_experts: int = num(0, 0)       # always-on experts beside the routed ones
    hidden: Optional[int] = num(None, 1, null="the model's ffn_hidden")   # each expert's SwiGLU inner size
    balance: str = "aux_loss"             # aux_loss | bias
    aux_loss_coef: float = num(0.01, 0)   # balance=aux_loss: the sequence-wise balance loss's alpha (0: none)
    bias_update: float = num(0.001, 0)    # balance=bias: the bias's step per optimizer step
    capacity_factor: Optional[float] = num(None, 0, low_open=True, null="dropless: every token routed")
    matmul: str = "loop"                  # loop | grouped

    def __post_init__(self):
        check_ranges(self, "model.moe")
        choice("model.moe.matmul", self.matmul, MATMULS)
        choice("model.moe.balance", self.balance, BALANCES)
        if self.top_k > self.experts:
            raise ConfigError(f"model.moe.top_k={self.top_k}: more than the {self.experts} experts; valid choices: "
                              f"1..{self.experts}")

    @property
    def loss_coef(self) -> float:
        """The balance loss's weight in the model's loss: none under bias balancing."""
        return self.aux_loss_coef if self.balance == "aux_loss" else 0.0
