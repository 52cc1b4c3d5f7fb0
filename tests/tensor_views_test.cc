// tests/tensor_views_test.cc: views share storage, see each other's writes, and never
// allocate (the allocator's counters do not move); the three copies do allocate.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::SimDeviceTest;

class TensorViewsTest : public SimDeviceTest {
 protected:
  // [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] as float32.
  Tensor Iota(std::vector<int64_t> shape) {
    std::vector<float> v(static_cast<size_t>(Numel(shape)));
    std::iota(v.begin(), v.end(), 0.0f);
    return from_vector(v, shape, tensor_test::kSimDevice);
  }
};

TEST_F(TensorViewsTest, EveryViewSharesStorageAndAllocatesNothing) {
  Tensor base = Iota({3, 4});
  const int64_t blocks = BlocksEverAllocated();
  const DeviceStats before = alloc().stats();

  std::vector<Tensor> views = {
      base.slice(0, 1, 3),
      base.slice(1, -3, kEnd, 2),
      base.select(1, -1),
      base.narrow(0, 1, 1),
      base.transpose(0, 1),
      base.t(),
      base.permute({1, 0}),
      base.view({2, 6}),
      base.reshape({-1}),
      base.view({3, 2, 2}).flatten(1),
      base.unsqueeze(0),
      base.unsqueeze(-1).squeeze(),
      base.unsqueeze(1).squeeze(1),
      base.slice(0, 0, 1).broadcast_to({5, 3, 4}),
      base.flatten(),
  };
  for (const Tensor& v : views) {
    EXPECT_TRUE(v.shares_storage_with(base)) << v.ToString();
  }
  EXPECT_EQ(base.use_count(), 1u + views.size());
  EXPECT_EQ(BlocksEverAllocated(), blocks) << "a view allocated";
  const DeviceStats after = alloc().stats();
  EXPECT_EQ(after.allocated_bytes[kAggregatePool].allocated,
            before.allocated_bytes[kAggregatePool].allocated);
  EXPECT_EQ(after.num_device_alloc, before.num_device_alloc);
}

TEST_F(TensorViewsTest, WritesThroughAViewAreVisibleInTheBase) {
  Tensor base = zeros({3, 4}, On());
  const int64_t blocks = BlocksEverAllocated();

  base.slice(0, 1, 2).fill_(7);                  // row 1
  base.select(1, -1).fill_(9);                   // last column
  base.t().select(0, 0).add_(1.0);               // column 0, through a transpose
  base.view({12}).slice(0, 0, 12, 5).mul_(2.0);  // elements 0, 5, 10

  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{2, 0, 0, 9,   //
                                                         8, 14, 7, 9,  //
                                                         1, 0, 0, 9}));
  EXPECT_EQ(BlocksEverAllocated(), blocks) << "in-place writes through views allocated";
}

TEST_F(TensorViewsTest, ViewShapesStridesAndValues) {
  Tensor base = Iota({3, 4});
  Tensor s = base.slice(1, 1, kEnd, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), IntList({3, 2}));
  EXPECT_EQ(s.strides(), IntList({4, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11}));

  EXPECT_EQ(base.slice(0, -2).to_vector<float>(),
            (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(base.slice(0, 2, 1).numel(), 0);  // stop <= start: empty, as in Python
  EXPECT_EQ(base.select(0, -1).to_vector<float>(), (std::vector<float>{8, 9, 10, 11}));
  EXPECT_EQ(base.narrow(1, -2, 2).to_vector<float>(),
            (std::vector<float>{2, 3, 6, 7, 10, 11}));
  EXPECT_EQ(base.t().to_vector<float>(),
            (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));

  Tensor p = Iota({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), IntList({4, 2, 3}));
  EXPECT_EQ(p.strides(), IntList({1, 12, 4}));

  Tensor b = base.select(0, 0).broadcast_to({2, 4});
  EXPECT_EQ(b.strides(), IntList({0, 1}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 0, 1, 2, 3}));
  Tensor col = base.slice(1, 0, 1).broadcast_to({3, 4});  // [3, 1] -> [3, 4]
  EXPECT_EQ(col.strides(), IntList({4, 0}));

  EXPECT_EQ(base.unsqueeze(1).shape(), IntList({3, 1, 4}));
  EXPECT_EQ(base.unsqueeze(-1).shape(), IntList({3, 4, 1}));
  EXPECT_EQ(base.view({3, 1, 4, 1}).squeeze().shape(), IntList({3, 4}));
  EXPECT_EQ(Iota({2, 3, 4}).flatten(0, 1).shape(), IntList({6, 4}));
  EXPECT_EQ(base.view({-1, 2}).shape(), IntList({6, 2}));
}

// Views of views: each view's offset adds to the offset of the view it is taken from
// (a slice, narrow or select that overwrote it would read from the base's start). Every
// case starts from a view that already has an offset.
TEST_F(TensorViewsTest, ViewsOfViewsWithOffsetsCompose) {
  Tensor base = Iota({4, 6});  // element (r, c) holds 6r + c
  const Tensor rows = base.slice(0, 1, 4);  // rows 1..3, offset 6
  ASSERT_EQ(rows.offset(), 6);
  const Tensor cols = rows.slice(1, 2, kEnd);  // rows 1..3, columns 2..5, offset 8
  EXPECT_EQ(cols.offset(), 8);
  EXPECT_EQ(cols.to_vector<float>(),
            (std::vector<float>{8, 9, 10, 11, 14, 15, 16, 17, 20, 21, 22, 23}));
  struct Case {
    const char* what;
    Tensor view;
    int64_t offset;
    std::vector<float> values;
  };
  const std::vector<Case> cases = {
      {"slice of a slice", rows.slice(0, 1, 3), 12,
       {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}},
      {"narrow of a slice", rows.narrow(1, 1, 2), 7, {7, 8, 13, 14, 19, 20}},
      {"narrow of a narrow", cols.narrow(0, 1, 2).narrow(1, 1, 2), 15, {15, 16, 21, 22}},
      {"stepped slice of a view", cols.slice(1, 1, kEnd, 2), 9, {9, 11, 15, 17, 21, 23}},
      {"select of a view", cols.select(0, 2), 20, {20, 21, 22, 23}},
      {"select of a transposed view", cols.t().select(0, 3), 11, {11, 17, 23}},
      {"slice of a select", base.select(0, 2).slice(0, 3, 5), 15, {15, 16}},
      {"view of a view", rows.select(0, 1).view({2, 3}).narrow(0, 1, 1), 15,
       {15, 16, 17}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(c.view.offset(), c.offset);
    EXPECT_EQ(c.view.to_vector<float>(), c.values);
  }
  // Writes land where the composed view says.
  rows.narrow(1, 4, 1).narrow(0, 2, 1).fill_(-1);  // element (3, 4)
  EXPECT_EQ(base.to_vector<float>()[22], -1.0f);
  EXPECT_EQ(base.to_vector<float>()[4], 4.0f);
}

TEST_F(TensorViewsTest, ReshapeIsAViewWhenStridesAllow) {
  Tensor base = Iota({4, 6});
  // Rows 1..2 are contiguous among themselves: viewable in any shape.
  Tensor rows = base.slice(0, 1, 3);
  Tensor r = rows.view({3, 4});
  EXPECT_TRUE(r.shares_storage_with(base));
  EXPECT_EQ(r.offset(), 6);
  // Splitting a strided dim is a view too.
  Tensor cols = base.slice(1, 0, 4);  // [4, 4], strides [6, 1]
  Tensor split = cols.view({2, 2, 4});
  EXPECT_EQ(split.strides(), IntList({12, 6, 1}));
  EXPECT_EQ(split.to_vector<float>(), cols.to_vector<float>());
  // A transposed tensor can gain or lose dims of size 1.
  Tensor tt = base.t().view({6, 1, 4});
  EXPECT_EQ(tt.to_vector<float>(), base.t().to_vector<float>());
}

TEST_F(TensorViewsTest, ContiguousReturnsTheSameTensorWhenAlreadyContiguous) {
  Tensor base = Iota({3, 4});
  const int64_t blocks = BlocksEverAllocated();
  Tensor same = base.slice(0, 1, 3).contiguous();  // rows: contiguous already
  EXPECT_TRUE(same.shares_storage_with(base));
  EXPECT_EQ(BlocksEverAllocated(), blocks);

  Tensor copy = base.t().contiguous();  // a real copy
  EXPECT_FALSE(copy.shares_storage_with(base));
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_EQ(copy.to_vector<float>(), base.t().to_vector<float>());
  EXPECT_EQ(BlocksEverAllocated(), blocks + 1);
  // After contiguous() the reshape that a transpose cannot be is a view of the copy.
  Tensor flat = copy.view({12});
  EXPECT_TRUE(flat.shares_storage_with(copy));
  EXPECT_EQ(flat.to_vector<float>(), base.t().to_vector<float>());
  // The copy is independent of the base.
  copy.fill_(0);
  EXPECT_EQ(base.to_vector<float>()[1], 1.0f);
}

TEST_F(TensorViewsTest, CloneAndToCopy) {
  Tensor base = Iota({2, 3});
  const int64_t blocks = BlocksEverAllocated();
  Tensor c = base.clone();
  EXPECT_FALSE(c.shares_storage_with(base));
  EXPECT_EQ(c.to_vector<float>(), base.to_vector<float>());
  EXPECT_EQ(BlocksEverAllocated(), blocks + 1);

  Tensor same = base.to(tensor_test::kSimDevice);  // already there: no copy
  EXPECT_TRUE(same.shares_storage_with(base));
  Tensor on_cpu = base.t().to(DeviceId{});  // strided source, other device
  EXPECT_EQ(on_cpu.device(), DeviceId{});
  EXPECT_TRUE(on_cpu.is_contiguous());
  EXPECT_EQ(on_cpu.to_vector<float>(), base.t().to_vector<float>());
  EXPECT_EQ(BlocksEverAllocated(), blocks + 1) << "to() allocated on the wrong device";
}

TEST_F(TensorViewsTest, BFloat16IsStorageOnly) {
  Tensor b = full({2, 2}, 1.5, On(DType::kBFloat16));
  Tensor c = b.t().clone();
  const std::vector<BFloat16> v = c.to_vector<BFloat16>();
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(static_cast<float>(v[3]), 1.5f);
  EXPECT_THROW(add(b, b), InvalidArgumentError);
}

}  // namespace
}  // namespace devmem
