"""The causal-LM head with the fused linear cross-entropy: the loss without the logits.

``CausalLMFusedLoss`` replaces the ``forward`` of transformers' ``*ForCausalLM`` (Qwen2, Llama,
Mistral, Qwen3: same signature; the KV cache under the installed release's name). While training
with labels it computes the loss with
:func:`fused_linear_cross_entropy` straight from the last hidden states, so the
(tokens × vocab) logits and their fp32 copy are never materialised; ``outputs.logits`` is then
``None`` (as with Liger's fused loss). Without labels, or in eval mode, it returns the logits
exactly like the original. ``return_dict=False`` (or ``config.return_dict=False``) gives a tuple,
as the original's ``can_return_tuple`` does.

``MoECausalLMFusedLoss`` does the same for the mixture-of-experts heads (Qwen3-MoE, Mixtral, GPT-OSS,
ERNIE-4.5-MoE): with ``output_router_logits`` (the argument, else ``config.output_router_logits``) it
adds the router's load-balancing loss, computed by the modeling module's own
``load_balancing_loss_func`` and weighted by ``router_aux_loss_coef``, to every loss it computes (from
``labels`` or ``shift_labels``), and returns the router logits.
"""

import sys


import torch
from torch import nn

from .transformers_api import CACHE_ARGUMENT, LEGACY_CACHE_ARGUMENT
from .fused_linear_cross_entropy import fused_linear_cross_entropy

IGNORE_INDEX = -100


def causal_lm_loss(hidden_states, lm_head, labels, *, num_items_in_batch=None, shift_labels=None):
    """transformers' ``ForCausalLMLoss`` (shift, ignore -100, mean or sum / num_items_in_batch),
    fused with the LM head projection."""
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    target = shift_labels.reshape(-1).to(hidden.device)
    if num_items_in_batch is None:
        return fused_linear_cross_entropy(hidden, lm_head.weight, target, lm_head.bias, ignore_index=IGNORE_INDEX)
    loss = fused_linear_cross_entropy(hidden, lm_head.weight, target, lm_head.bias, ignore_index=IGNORE_INDEX,
                                      reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _logits_input(hidden_states, logits_to_keep):
    """The positions whose logits are asked for: transformers' ``slice_logits_to_keep`` where the
    installed release has it (5.24 added 2-D position and mask tensors), else the int-or-indices slice."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep
    except ImportError:
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return hidden_states[:, slice_indices, :]
    return slice_logits_to_keep(hidden_states, logits_to_keep)


def _run_model(self, call, cache, kwargs):
    """``self.model`` called as the original head calls it; the cache under either name, and the
    arguments the loss takes out of ``kwargs``."""
    if LEGACY_CACHE_ARGUMENT in kwargs and CACHE_ARGUMENT != LEGACY_CACHE_ARGUMENT:
        # the replaced forward still takes the old name as a deprecated keyword
        if cache is not None:
            raise ValueError(f"pass the KV cache as {CACHE_ARGUMENT}= or as {LEGACY_CACHE_ARGUMENT}=, not both")
        cache = kwargs.pop(LEGACY_CACHE_ARGUMENT)
    loss_args = {name: kwargs.pop(name, None) for name in ("num_items_in_batch", "shift_labels")}
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    # the inner model would return a tuple too under config.return_dict=False: ask for the dataclass
    outputs = self.model(**call, return_dict=True, **{CACHE_ARGUMENT: cache}, **kwargs)
    return outputs, loss_args, return_dict


def _loss_and_logits(self, hidden_states, labels, logits_to_keep, loss_args, kwargs):
    """``(loss, logits)``: the fused loss and no logits while training with labels, else what the original computes."""
    num_items_in_batch, shift_labels = loss_args["num_items_in_batch"], loss_args["shift_labels"]
    if self.training and (labels is not None or shift_labels is not None):
        loss = causal_lm_loss(hidden_states, self.lm_head, labels, num_items_in_batch=num_items_in_batch,
                              shift_labels=shift_labels)
        return loss, None
    logits = self.lm_head(_logits_input(hidden_states, logits_to_keep))
    loss = None
    if labels is not None or shift_labels is not None:
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size,
                                  num_items_in_batch=num_items_in_batch, shift_labels=shift_labels, **kwargs)
    return loss, logits


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                       labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    call = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                inputs_embeds=inputs_embeds, use_cache=use_cache)
    outputs, loss_args, return_dict = _run_model(self, call, cache, kwargs)
    loss, logits = _loss_and_logits(self, outputs.last_hidden_state, labels, logits_to_keep, loss_args, kwargs)
    output = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                    attentions=outputs.attentions,
                                    **{CACHE_ARGUMENT: getattr(outputs, CACHE_ARGUMENT)})
    return output if return_dict else output.to_tuple()


def _load_balancing_loss(head):
    """The modeling module's own ``load_balancing_loss_func`` (the families differ in how they weigh padding
    and top-k), found along the MRO: FSDP2 and user subclasses live in other modules."""
    for cls in type(head).__mro__:
        found = getattr(sys.modules.get(cls.__module__), "load_balancing_loss_func", None)
        if found is not None:
            return found
    raise TypeError(f"MoECausalLMFusedLoss: no load_balancing_loss_func in the modules of {type(head).__name__}'s "
                    "classes; call the model with output_router_logits=False, or unbind its head")


def _moe_causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                           inputs_embeds=None, labels=None, use_cache=None, output_router_logits=None,
                           logits_to_keep=0, **kwargs):
    from transformers.modeling_outputs import MoeCausalLMOutputWithPast

    if output_router_logits is None:
        output_router_logits = self.config.output_router_logits
    call = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                inputs_embeds=inputs_embeds, use_cache=use_cache, output_router_logits=output_router_logits)
    outputs, loss_args, return_dict = _run_model(self, call, cache, kwargs)
    loss, logits = _loss_and_logits(self, outputs.last_hidden_state, labels, logits_to_keep, loss_args, kwargs)
    aux_loss = None
    if output_router_logits:
        balancing = _load_balancing_loss(self)
        aux_loss = balancing(outputs.router_logits, self.num_experts, self.num_experts_per_tok, attention_mask)
        if loss is not None:  # labels or shift_labels: the original adds it with labels, and takes no shift_labels
            loss = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
    output = MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits, hidden_states=outputs.hidden_states,
                                       attentions=outputs.attentions, router_logits=outputs.router_logits,
                                       **{CACHE_ARGUMENT: getattr(outputs, CACHE_ARGUMENT)})
    return output if return_dict else output.to_tuple()


class CausalLMFusedLoss(nn.Module):
    """``*ForCausalLM.forward`` computing the training loss with the fused linear cross-entropy.

    Uses the replaced module's ``model``, ``lm_head`` and ``training``. Its KV-cache parameter has
    the installed transformers' name (:data:`~twinkle_triton.transformers_api.CACHE_ARGUMENT`).
    """

    has_backward = True
    can_torch_compile = True

    if CACHE_ARGUMENT == "cache":
        forward = _causal_lm_forward
    else:
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
            return _causal_lm_forward(self, input_ids, attention_mask, position_ids, past_key_values, inputs_embeds,
                                      labels, use_cache, logits_to_keep, **kwargs)


class MoECausalLMFusedLoss(nn.Module):
    """``*ForCausalLM.forward`` of a mixture-of-experts model computing the training loss with the fused
    linear cross-entropy, plus the router's load-balancing loss when ``output_router_logits`` asks for it.

    Uses the replaced module's ``model``, ``lm_head``, ``training``, ``num_experts``,
    ``num_experts_per_tok`` and ``router_aux_loss_coef``.
    """

    has_backward = True
    can_torch_compile = True

    if CACHE_ARGUMENT == "cache":
        forward = _moe_causal_lm_forward
    else:
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    inputs_embeds=None, labels=None, use_cache=None, output_router_logits=None, logits_to_keep=0,
                    **kwargs):
            return _moe_causal_lm_forward(self, input_ids, attention_mask, position_ids, past_key_values,
                                          inputs_embeds, labels, use_cache, output_router_logits, logits_to_keep,
                                          **kwargs)
