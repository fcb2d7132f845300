"""A right answer to PS1.19, written as a student would: for the grading mode's tests."""
import math

import torch
import torch.nn.functional as F


def divergence(student_logits, teacher_logits, beta):
    """[..., V] logits each -> [...] divergences (float32)."""
    log_pi = F.log_softmax(student_logits.float(), dim=-1)
    log_teacher = F.log_softmax(teacher_logits.float(), dim=-1)
    pi = log_pi.exp()
    teacher = log_teacher.exp()
    if beta == 1:
        return (pi * (log_pi - log_teacher)).sum(dim=-1)
    if beta == 0:
        return (teacher * (log_teacher - log_pi)).sum(dim=-1)
    # log m, m = beta pi_T + (1 - beta) pi, without leaving log space
    log_m = torch.logaddexp(log_teacher + math.log(beta), log_pi + math.log(1 - beta))
    kl_teacher_m = (teacher * (log_teacher - log_m)).sum(dim=-1)
    kl_pi_m = (pi * (log_pi - log_m)).sum(dim=-1)
    return beta * kl_teacher_m + (1 - beta) * kl_pi_m
