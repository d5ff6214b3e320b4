"""Per-channel mean and std of each dataset, on the [0, 1] pixel scale: the one home of these numbers.

Models normalise their own input with them (``attnconv.models.normalize.Normalize``), so a preset
built for a dataset carries that dataset's values as constructor arguments:

* ``CIFAR10_MEAN``/``CIFAR10_STD``: the fixed values the paper's training code uses (its std is not
  the population std of the training images; ``load_splits("cifar10")`` keeps the paper's values).
* ``DIGITS_MEAN``/``DIGITS_STD``: all 1797 images of scikit-learn's 8×8 digits (values / 16).
* ``FASHION_MNIST_MEAN``/``FASHION_MNIST_STD``: Fashion-MNIST's training split, the 55000 images
  left after the seed-0 validation carve of ``load_splits``.
* ``FASHION_MNIST_ANYWHERE_MEAN``/``_STD``: the same 55000 images placed on the 32×32 canvas as
  the validation images are (``attnconv.data.anywhere.fixed_placements`` of the official training
  set), fixed like CIFAR-10's: training draws new placements every epoch, so no one rendering of
  the training split is "the" split.
"""

from __future__ import annotations

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
DIGITS_MEAN = (0.3053,)
DIGITS_STD = (0.3759,)
FASHION_MNIST_MEAN = (0.2859,)
FASHION_MNIST_STD = (0.3529,)
FASHION_MNIST_ANYWHERE_MEAN = (0.1135,)
FASHION_MNIST_ANYWHERE_STD = (0.2521,)
